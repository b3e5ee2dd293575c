"""The small FedRC run of the console and batch-limit tests: 8 digits clients, 2 concepts, 4 per round."""

from __future__ import annotations

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated


def small_strategy(**options) -> lf.FedRCStrategy:
    return lf.FedRCStrategy(num_clusters=2, local_steps=2, clients_per_round=4, **options)


def small_datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=8, concepts=2, dirichlet_alpha=1.0, seed=0)
