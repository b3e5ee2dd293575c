"""Running a rule's components: the client hooks in order after the E-step, the server hooks in
order after a round's aggregation (the first decisive component that acts ends the round's
decisions), the union of their declared entries, and the turn's plan and server weights carried
to the rule's ``local_plan`` and ``contributions``.

``RunsComponents`` is what a rule derives from to run components: FedRC and FedEM (their
mechanisms built from ``FedRC.Config`` or given), IFCA (given).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.client_state import StateEntry
from lightning_fedcluster.algorithms.client_turn import ClientContext, ClientReport, Contribution, LocalPlan
from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    ClientTurn,
    Component,
    DiscoveryView,
    TurnReport,
    client_scores,
    scores_entry,
)
from lightning_fedcluster.algorithms.protocols import ClientOutputs
from lightning_fedcluster.algorithms.server_view import ServerView


def run_client(components: Iterable[Component], turn: ClientTurn) -> ClientTurn:
    """Each component's client hook in order, each on the turn the previous one returned."""
    for component in components:
        turn = component.client(turn)
    return turn


def run_server(components: Iterable[Component], view: DiscoveryView) -> list[ServerAction]:
    """Each component's actions in order: a non-decisive component's are kept; the first decisive
    component that returns actions ends the round's decisions (the later ones are not asked)."""
    actions: list[ServerAction] = []
    for component in components:
        found = component.actions(view)
        actions += found
        if component.decisive and found:
            break
    return actions


def declared_entries(
    components: Iterable[Component], num_clusters: int, scores: bool = False
) -> tuple[StateEntry, ...]:
    """The components' entries in order, each name once (two declarations of one name must be
    equal), then, with ``scores``, each client's mean score per cluster (``CLUSTER_SCORES``)."""
    named: dict[str, StateEntry] = {}
    listed = [e for c in components for e in c.state_entries(num_clusters)]
    for entry in [*listed, *((scores_entry(num_clusters),) if scores else ())]:
        if named.setdefault(entry.name, entry) != entry:
            raise ValueError(
                f"two components declare the client-store entry {entry.name!r} differently: "
                f"{named[entry.name]} and {entry}"
            )
    return tuple(named.values())


def turn_report(turn: ClientTurn) -> ClientReport:
    """The turn's report, carrying its ``train_clusters`` and ``copy_weights`` when either is set."""
    if turn.train_clusters is None and turn.copy_weights is None:
        return turn.report
    report = turn.report
    return TurnReport(
        gamma=report.gamma,
        omega=report.omega,
        label_sums=report.label_sums,
        train_clusters=turn.train_clusters,
        copy_weights=turn.copy_weights,
    )


def turn_plan(report: ClientReport) -> LocalPlan | None:
    """The plan a component chose (train only ``train_clusters``, each sample weight 1), or None."""
    clusters = getattr(report, "train_clusters", None)
    return None if clusters is None else LocalPlan(clusters=tuple(clusters))


def turn_contributions(
    report: ClientReport, plan: LocalPlan, context: ClientContext
) -> list[Contribution] | None:
    """Each trained copy k into its own cluster with weight N_i · m_k (the turn's ``copy_weights``),
    or None when no component set them."""
    weights = getattr(report, "copy_weights", None)
    if weights is None:
        return None
    multipliers, size = weights.tolist(), float(context.num_samples)
    return [Contribution(k, k, size * multipliers[k]) for k in plan.clusters]


class RunsComponents:
    """A rule that runs discovery components (see the module docstring). The rule calls
    ``use_components`` once, ``run_components`` after its E-step for each client, and
    ``turn_plan``/``turn_contributions`` first in ``local_plan``/``contributions``; it declares
    ``component_entries()`` among its ``state_entries``; ``after_round`` runs the server hooks."""

    components: tuple[Component, ...] = ()
    num_clusters: int

    def use_components(self, components: Sequence[Component]) -> None:
        """Take ``components`` (in their order), each checked against this rule (and its other
        components) before training."""
        components = self.components = tuple(components)
        for component in components:
            if not isinstance(component, Component):
                raise TypeError(
                    f"components must be discovery Components (algorithms/discovery), got "
                    f"{type(component).__name__}"
                )
            if component.wants_outputs and not isinstance(self, ClientOutputs):
                raise ValueError(
                    f"{type(component).__name__} reads the models' outputs on the client's rows, which "
                    f"{type(self).__name__} does not give its E-step: use it with FedRC or FedEM"
                )
            component.check(self)

    @property
    def wants_scores(self) -> bool:
        """Whether clients report their mean E-step score per cluster (``CLUSTER_SCORES``)."""
        return any(component.wants_scores for component in self.components)

    def component_entries(self) -> tuple[StateEntry, ...]:
        """The components' client-store entries (and ``CLUSTER_SCORES`` when one wants scores)."""
        return declared_entries(self.components, self.num_clusters, self.wants_scores)

    def run_components(
        self,
        report: ClientReport,
        losses: Tensor,
        labels: Tensor,
        log_label_stats: Tensor | None,
        context: ClientContext,
    ) -> ClientReport:
        """After the rule's E-step of one client: its scores (when wanted), then each component's
        client hook; the report with the turn's plan and weights."""
        if self.wants_scores:
            context.extra[CLUSTER_SCORES] = client_scores(losses, labels, log_label_stats)
        if not self.components:
            return report
        turn = run_client(self.components, ClientTurn(report, losses, labels, log_label_stats, context))
        return turn_report(turn)

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """The components' server hooks (``run_server``)."""
        return run_server(self.components, DiscoveryView(server, server.num_rounds))


def rule_option(rule: Any, name: str) -> Any:
    """A rule's option ``name`` (``rule.config.<name>``), or None when it has none."""
    return getattr(getattr(rule, "config", None), name, None)
