"""Re-seeding a dead cluster (an option of FedRC/FedEM, ``reseed_threshold``, off by default and in
the paper presets).

A soft-EM cluster whose share of the data falls to ~0 rarely comes back: each client's ω for it
shrinks multiplicatively, and two concepts then share one model (the main job's scenario loses
a cluster on 4 of 6 seeds). The remedy splits the largest cluster into the dead one: the dead
cluster restarts from the largest cluster's model, a seeded random half of the largest cluster's
clients (by argmax ω) move ``SPLIT_SHARE`` of their ω and label sums on it to the re-seeded
cluster, the other half ``1 − SPLIT_SHARE``. The two copies then see different client mixes, so
a merged pair of concepts drifts apart as in a 2-means split; nobody's ω on either cluster is
zero, so the E-step can still move every client back. This is a heuristic in the spirit of
HCFL's cluster splitting (Guo, Tang, Lin, ICLR 2025), not HCFL's own test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, ServerAction, SplitCluster
from lightning_fedcluster.algorithms.discovery.protocol import Component, DiscoveryView, cluster_shares
from lightning_fedcluster.algorithms.discovery.runner import rule_option
from lightning_fedcluster.algorithms.seeds import derive_seed

RESEED_SPLIT = 0x5E1D  # seed salt of the random half
SPLIT_SHARE = 0.9  # the share of ω on the largest cluster that the chosen half moves


@dataclass(frozen=True)
class ClusterReseed(Component):
    """``threshold``: the share of γ below which a cluster is dead (e.g. 0.05); ``seed``: seeds the
    random half (the strategy's ``seed``). Decisive: one re-seeding a round at most."""

    threshold: float
    seed: int = 0
    decisive = True

    def __post_init__(self) -> None:
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
            raise ValueError(f"reseed_threshold must be in (0, 1) (e.g. 0.05), got {threshold!r}")

    def check(self, rule: Any) -> None:
        if rule_option(rule, "adam_gamma"):
            raise ValueError(
                "reseed_threshold cannot be combined with adam_gamma (each sample's γ would have to be "
                "split too): use one or the other"
            )

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """After round ``view.round_index``: the split that re-seeds a dead cluster, else none."""
        state, round_index = view.state, view.round_index
        split = reseed_split(
            state.omega,
            view.outcome.train_sizes,
            state.seen,
            state.active,
            self.threshold,
            self.seed,
            round_index,
        )
        if split is None:
            return []
        note = Note(
            f"round {round_index + 1}: re-seeded cluster {split.target} (share of γ below "
            f"{self.threshold}) from cluster {split.source}, splitting its "
            f"{split.clients.numel()} clients"
        )
        return [split, note]


def reseed_split(
    omega: Tensor, sizes: Tensor, seen: Tensor, active: Tensor, threshold: float, seed: int, round_index: int
) -> SplitCluster | None:
    """The split that re-seeds the emptiest active cluster whose share is below ``threshold`` from
    the largest one, or None (no dead cluster, or the largest has fewer than two clients)."""
    if int(seen.sum()) < 2:
        return None
    share = cluster_shares(omega, sizes, seen)
    dead = active & (share < threshold)
    if not bool(dead.any()):
        return None
    target = int(torch.argmin(torch.where(dead, share, torch.full_like(share, torch.inf))))
    source = int(torch.argmax(torch.where(active, share, torch.full_like(share, -1.0))))
    members = (seen & (omega.argmax(1) == source)).nonzero().flatten()
    if source == target or members.numel() < 2:
        return None
    generator = torch.Generator().manual_seed(derive_seed(seed, round_index, RESEED_SPLIT))
    order = members[torch.randperm(members.numel(), generator=generator)]
    to_target = torch.full((members.numel(),), 1 - SPLIT_SHARE, dtype=torch.float64)
    to_target[: members.numel() // 2] = SPLIT_SHARE
    return SplitCluster(target=target, source=source, clients=order, to_target=to_target)
