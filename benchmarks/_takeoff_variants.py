"""Take-off mechanisms screened in the take-off study that did not become library options, kept here so that
their recorded numbers can be reproduced (``--anneal`` of ``authors_comparison.py run`` and
``digits_concepts.py``), and the true-concept ceiling of ``takeoff_runs.py``'s ``true-*`` runs.

``AnnealedFedRC``: FedRC whose E-step raises the likelihood ratios to a power β that falls
linearly from ``beta0`` at round 0 to 1 at round ``rounds`` (γ_jk ∝ ω_k (p_k(y_j|x_j) / C_{y_j,k})^β):
with β > 1 the E-step sharpens, so small differences between the models give the clusters more
different training weights sooner; β < 1 is deterministic annealing's tempering.
"""

from __future__ import annotations

from torch import Tensor

from lightning_fedcluster.algorithms.assignment import assignment_report
from lightning_fedcluster.algorithms.base import ClientContext, ClientReport, ClientRule
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES, client_scores
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.fedrc_config import FedRCConfig


class AnnealedFedRC(FedRC):
    """FedRC with an annealed E-step (see the module docstring)."""

    def __init__(self, num_clusters: int, *, beta0: float, rounds: int, **options) -> None:
        super().__init__(num_clusters, **options)
        self.beta0, self.anneal_rounds = beta0, rounds

    def beta(self, round_index: int) -> float:
        if round_index >= self.anneal_rounds:
            return 1.0
        return self.beta0 + (1.0 - self.beta0) * round_index / self.anneal_rounds

    def e_step_many(
        self,
        losses: Tensor,
        labels: Tensor,
        offsets: Tensor,
        contexts: list[ClientContext],
        log_label_stats: Tensor | None,
    ) -> list[ClientReport]:
        beta = self.beta(contexts[0].round_index)
        stats = None if log_label_stats is None else beta * log_label_stats
        return super().e_step_many(beta * losses, labels, offsets, contexts, stats)

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        beta = self.beta(context.round_index)
        stats = None if log_label_stats is None else beta * log_label_stats
        return super().e_step(beta * losses, labels, context, stats)


def anneal(strategy, spec: str | None):  # noqa: ANN001, ANN201
    """Replace the strategy's FedRC rule by ``AnnealedFedRC`` for ``spec`` = "BETA0:ROUNDS"."""
    if spec is None:
        return strategy
    beta0, rounds = spec.split(":")
    rule = strategy.algorithm
    strategy._rule = AnnealedFedRC(
        rule.num_clusters,
        beta0=float(beta0),
        rounds=int(rounds),
        use_label_stats=rule.config.use_label_stats,
        reseed_seed=rule.config.reseed_seed,
    )
    return strategy


class TrueConceptFedRC(FedRC):
    """FedRC told each client's concept: γ and ω one-hot at it (cluster k serves concept k), so the
    cluster models are what a clustering that is right from round 1 trains: the ceiling the take-off
    mechanisms are measured against. A client then trains its concept's copy alone (the engine
    trains no copy whose γ sums to zero), so each cluster is FedAvg over its concept's clients.
    Each client's mean E-step score per cluster is reported every round, so where FedRC's E-step
    would place it under these models can be read offline."""

    def __init__(self, num_clusters: int, config: FedRCConfig, *, concepts: Tensor) -> None:
        super().__init__(num_clusters, config)
        if int(concepts.max()) >= num_clusters:
            raise ValueError(f"concepts go to {int(concepts.max())}: num_clusters must exceed it")
        self.concepts = concepts

    @property
    def wants_scores(self) -> bool:
        return True

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        stats = log_label_stats if self.config.use_label_stats else None
        context.extra[CLUSTER_SCORES] = client_scores(losses, labels, stats)
        concept = int(self.concepts[context.client])
        return assignment_report(concept, losses, labels, context.num_classes)

    # FedRC batches its E-step; this one runs ``e_step`` client by client, as a plain client rule
    e_step_many = ClientRule.e_step_many


def true_concepts(strategy, concepts: Tensor):  # noqa: ANN001, ANN201
    """Replace the strategy's FedRC rule by ``TrueConceptFedRC`` with the same configuration."""
    rule = strategy.algorithm
    strategy._rule = TrueConceptFedRC(rule.num_clusters, rule.config, concepts=concepts)
    return strategy
