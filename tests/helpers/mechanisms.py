"""FedRC with every concept-discovery mechanism of its Config at once (grouping with margin, hold,
ramp, retire share and release; merging; the ω weighting with ramp and strength), early and small
enough for a 3-round fit: the configuration the executor, process and Flower equivalences share."""

from __future__ import annotations

from lightning_fedcluster.algorithms import FedRC

EVERY_MECHANISM = FedRC.Config(
    group_round=1,
    group_hold=2,
    group_ramp=1,
    group_margin=0.9,
    group_retire=0.2,
    group_release=0.0,
    group_release_rounds=1,
    merge_threshold=100.0,
    merge_after=2,
    omega_weighting_from=1,
    omega_weighting_ramp=1,
    omega_weighting_strength=0.5,
)
