"""CFL (Sattler, Müller, Samek 2020): recursive bi-partitioning by the cosine similarity of
client updates. Plain tensors only.

Clients start in one cluster. After a round, a cluster whose weighted mean update is small
(‖Σ_i w_i Δ_i‖ < ε1: its joint objective is near a stationary point) while some member still
moves a lot (max_i ‖Δ_i‖ > ε2) is split in two by complete-linkage clustering of the members'
pairwise cosine similarities. The new cluster starts from a copy of its parent. ``num_clusters``
is the maximum number of clusters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sklearn.cluster import AgglomerativeClustering
from torch import Tensor

from lightning_fedcluster.algorithms.actions import CopyCluster, Note, Reassign, ServerAction
from lightning_fedcluster.algorithms.assignment import assignment_report
from lightning_fedcluster.algorithms.base import (
    ClientContext,
    ClientReport,
    HardAssignment,
    LocalPlan,
    RoundVectors,
)
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.server_view import ServerView
from lightning_fedcluster.arguments import number_arg


def cosine_similarity_matrix(updates: Tensor) -> Tensor:
    """[n, n] pairwise cosine similarities of the rows of ``updates`` [n, P] (zero rows give 0)."""
    updates = updates.to(torch.float64)
    norms = updates.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    unit = updates / norms
    return unit @ unit.T


def bipartition(similarity: Tensor) -> Tensor:
    """Split n >= 2 items in two by complete linkage on the distance 1 − cos. Returns a [n] bool
    mask of the second group (the group of item 0 is always False, for determinism)."""
    distance = (1.0 - similarity).clamp_min(0).numpy()
    labels = (
        AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(distance).labels_
    )
    labels_t = torch.as_tensor(labels)
    return labels_t != labels_t[0]


def split_decision(updates: Tensor, weights: Tensor, eps1: float, eps2: float) -> bool:
    """Whether a cluster with member updates [n, P] and weights [n] should split (needs n >= 2)."""
    if updates.shape[0] < 2:
        return False
    w = weights.to(torch.float64) / weights.to(torch.float64).sum()
    mean_norm = float((w.unsqueeze(1) * updates.to(torch.float64)).sum(0).norm())
    max_norm = float(updates.to(torch.float64).norm(dim=1).max())
    return mean_norm < eps1 and max_norm > eps2


@dataclass(frozen=True)
class CFLConfig:
    """CFL's options, ``CFL.Config``.

    Args:
        eps1: split a cluster only when its weighted mean update norm ‖Σ_i w_i Δ_i‖ is below this
            (its joint objective is near a stationary point) ...
        eps2: ... and some member's update norm max_i ‖Δ_i‖ is above this.
    """

    eps1: float = 0.4
    eps2: float = 1.6

    def __post_init__(self) -> None:
        number_arg("eps1", self.eps1, strict=True)
        number_arg("eps2", self.eps2, strict=True)


class CFL(HardAssignment):
    """CFL's rules; ``num_clusters`` is the most clusters the splits may create (one at the
    start). Options in [`CFLConfig`][lightning_fedcluster.algorithms.cfl.CFLConfig] (``CFL.Config``): ``CFL(4,
    eps1=0.4, eps2=1.6)``."""

    Config = CFLConfig
    config: CFLConfig

    def initial_active(self) -> Tensor:
        """Every client starts in cluster 0; the others wait for splits."""
        active = torch.zeros(self.num_clusters, dtype=torch.bool)
        active[0] = True
        return active

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        k = int(torch.argmax(context.omega)) if context.seen else 0
        return assignment_report(k, losses, labels, context.num_classes)

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        return LocalPlan(clusters=(int(torch.argmax(report.omega)),))

    def round_vectors(self, state: ClientState | None) -> RoundVectors | None:
        return "update"

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """Split every cluster whose members' updates meet the ε1/ε2 rule (a new cluster starts as
        a copy of its parent; the second group of the bi-partition moves to it)."""
        outcome = server.outcome
        assert outcome.vectors is not None
        actions: list[ServerAction] = []
        clusters = outcome.omega.argmax(1)
        for parent, child, moving in self.plan_splits(
            clusters, outcome.vectors, outcome.sizes, server.active
        ):
            movers = outcome.clients[moving]
            omega = torch.zeros(len(movers), self.num_clusters, dtype=torch.float64)
            omega[:, child] = 1.0
            actions += [
                CopyCluster(child, parent),
                Reassign(movers, omega),
                Note(
                    f"round {outcome.round_index + 1}: CFL split cluster {parent}; clients {movers.tolist()} "
                    f"move to new cluster {child}"
                ),
            ]
        return actions

    def plan_splits(
        self, clusters: Tensor, updates: Tensor, sizes: Tensor, active: Tensor
    ) -> list[tuple[int, int, Tensor]]:
        """Splits after a round. ``clusters`` [n] cluster of each of the round's clients, ``updates``
        [n, P], ``sizes`` [n]. Returns (parent, child, mask over the n clients moving to child)."""
        free = [k for k in range(self.num_clusters) if not bool(active[k])]
        splits = []
        for parent in sorted(set(clusters.tolist())):
            if not free:
                break
            members = (clusters == parent).nonzero().flatten()
            if not split_decision(updates[members], sizes[members], self.config.eps1, self.config.eps2):
                continue
            second = bipartition(cosine_similarity_matrix(updates[members]))
            moving = torch.zeros(clusters.shape[0], dtype=torch.bool)
            moving[members[second]] = True
            splits.append((parent, free.pop(0), moving))
        return splits
