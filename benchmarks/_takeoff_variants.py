"""Take-off mechanisms screened in issue 25 that did not become library options, kept here so that
their recorded numbers can be reproduced (``--anneal`` of ``authors_comparison.py run`` and
``digits_concepts.py``).

``AnnealedFedRC``: FedRC whose E-step raises the likelihood ratios to a power β that falls
linearly from ``beta0`` at round 0 to 1 at round ``rounds`` (γ_jk ∝ ω_k (p_k(y_j|x_j) / C_{y_j,k})^β):
with β > 1 the E-step sharpens, so small differences between the models give the clusters more
different training weights sooner; β < 1 is deterministic annealing's tempering.
"""

from __future__ import annotations

from torch import Tensor

from lightning_fedcluster.algorithms.base import ClientContext, ClientReport
from lightning_fedcluster.algorithms.fedrc import FedRC


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
