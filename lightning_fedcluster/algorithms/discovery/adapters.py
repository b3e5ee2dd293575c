"""FedRC's mechanisms (grouping, release, merging, retirement, re-seeding, removal, the ω weighting)
as components, each wrapping its mechanism as configured in ``FedRC.Config``."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters, ServerAction
from lightning_fedcluster.algorithms.client_state import StateEntry
from lightning_fedcluster.algorithms.discovery.protocol import ClientTurn, Component, DiscoveryView
from lightning_fedcluster.algorithms.grouping import ConceptGrouping, held_report
from lightning_fedcluster.algorithms.hold_release import HoldRelease
from lightning_fedcluster.algorithms.merging import ClusterMerging
from lightning_fedcluster.algorithms.reseed import reseed_split
from lightning_fedcluster.algorithms.retirement import ClusterRetirement


@dataclass(frozen=True)
class GroupingStep(Component):
    grouping: ConceptGrouping
    decisive = True
    wants_outputs = True

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        return self.grouping.state_entries()

    def client(self, turn: ClientTurn) -> ClientTurn:
        grouping, context = self.grouping, turn.context
        if context.outputs is not None and grouping.wants_signature(context.round_index):
            grouping.record_signature(context.outputs, turn.labels, context.active, context.extra)
        weight = grouping.hold_weight(context.round_index, context.extra)
        if weight is None:
            return turn
        omega = context.omega.to(turn.report.gamma)
        report = held_report(
            omega, context.active, turn.labels, context.num_classes, turn.report.gamma, weight
        )
        return replace(turn, report=report)

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        return self.grouping.actions(view.state, view.round_index)


@dataclass(frozen=True)
class ReleaseStep(Component):
    release: HoldRelease
    grouping: ConceptGrouping
    wants_scores = True

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        return self.release.state_entries()

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        return self.release.actions(view.state, view.outcome, self.grouping)


@dataclass(frozen=True)
class MergingStep(Component):
    merging: ClusterMerging
    decisive = True
    wants_scores = True

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        return self.merging.actions(view.state, view.outcome.train_sizes, view.round_index)


@dataclass(frozen=True)
class RetirementStep(Component):
    retirement: ClusterRetirement
    decisive = True

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        return self.retirement.actions(view.state, view.round_index)


@dataclass(frozen=True)
class ReseedStep(Component):
    threshold: float
    seed: int
    decisive = True

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        state, outcome = view.state, view.outcome
        split = reseed_split(
            state.omega,
            outcome.train_sizes,
            state.seen,
            state.active,
            self.threshold,
            self.seed,
            view.round_index,
        )
        if split is None:
            return []
        note = Note(
            f"round {view.round_index + 1}: re-seeded cluster {split.target} (share of γ below "
            f"{self.threshold}) from cluster {split.source}, splitting its "
            f"{split.clients.numel()} clients"
        )
        return [split, note]


@dataclass(frozen=True)
class RemovalStep(Component):
    threshold: float
    after: int = 0
    decisive = True

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        from lightning_fedcluster.algorithms.fedrc import clusters_to_remove

        if view.round_index < self.after:
            return []
        state = view.state
        remove = clusters_to_remove(
            state.omega, view.outcome.train_sizes, state.seen, state.active, self.threshold
        )
        if not bool(remove.any()):
            return []
        kept = int((state.active & ~remove).sum())
        return [
            RemoveClusters(remove),  # the store renormalises the declared mixtures (γ) with ω
            Note(
                f"round {view.round_index + 1}: removed cluster(s) {remove.nonzero().flatten().tolist()} "
                f"(share of γ below the threshold); {kept} remain"
            ),
        ]


@dataclass(frozen=True)
class WeightingStep(Component):
    start: int
    ramp: int = 0
    strength: float = 1.0

    def client(self, turn: ClientTurn) -> ClientTurn:
        round_index = turn.context.round_index
        if round_index < self.start:
            return turn
        alpha = min(1.0, (round_index - self.start + 1) / (self.ramp + 1))
        alpha *= self.strength
        weights = [1.0 - alpha + alpha * w for w in turn.report.omega.tolist()]
        return replace(turn, copy_weights=torch.tensor(weights, dtype=torch.float64))
