"""Adaptive K by removal (FedRC App. F, ``removal_threshold``): start with a generous K and, after a
round, remove the clusters whose share of γ over the seen clients' data fell below δ.

A cluster's share is (1/N) Σ_{i,j} γ_{ij;k} = Σ_i N_i ω_ik / Σ_i N_i over the clients seen so far
([`cluster_shares`][lightning_fedcluster.algorithms.discovery.protocol.cluster_shares]); the
removal never takes the last alive cluster (the largest share survives), and the store
renormalises ω (and the declared per-sample mixtures, FedRC-Adam's γ) over the rest. ``after``
(``removal_after``, ours) holds the removal back for the first rounds: before a concept grouping ω
is nearly uniform, and the shares that fall under δ then are chance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters, ServerAction
from lightning_fedcluster.algorithms.discovery.protocol import Component, DiscoveryView, cluster_shares


@dataclass(frozen=True)
class ClusterRemoval(Component):
    """``threshold``: δ, the share of γ below which a cluster is removed (the paper uses 0.05);
    ``after``: no removal in the first this-many rounds. Decisive."""

    threshold: float
    after: int = 0
    decisive = True

    def __post_init__(self) -> None:
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
            raise ValueError(f"removal_threshold must be in (0, 1) (the paper uses 0.05), got {threshold!r}")
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise ValueError(f"removal_after must be a number of rounds >= 0, got {self.after!r}")

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """After round ``view.round_index``: remove the clusters below δ when due, else none."""
        round_index, state = view.round_index, view.state
        if round_index < self.after:
            return []
        remove = clusters_to_remove(
            state.omega, view.outcome.train_sizes, state.seen, state.active, self.threshold
        )
        if not bool(remove.any()):
            return []
        kept = int((state.active & ~remove).sum())
        return [
            RemoveClusters(remove),  # the store renormalises the declared mixtures (γ) with ω
            Note(
                f"round {round_index + 1}: removed cluster(s) {remove.nonzero().flatten().tolist()} "
                f"(share of γ below the threshold); {kept} remain"
            ),
        ]


def clusters_to_remove(
    omega: Tensor, sizes: Tensor, seen: Tensor, active: Tensor, threshold: float
) -> Tensor:
    """Adaptive K (FedRC App. F): active clusters whose share (1/N) Σ_{i,j} γ_{ij;k} = Σ_i N_i ω_ik / Σ_i N_i
    over the clients seen so far is below ``threshold``. Never removes the last active cluster
    (the largest share survives). Returns a [K] bool mask of clusters to remove."""
    if not bool(seen.any()):
        return torch.zeros_like(active)
    share = cluster_shares(omega, sizes, seen)
    remove = active & (share < threshold)
    if bool(remove.sum() == active.sum()):
        keep = int(torch.argmax(torch.where(active, share, torch.full_like(share, -1.0))))
        remove[keep] = False
    return remove
