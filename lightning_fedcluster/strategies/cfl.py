"""CFLStrategy: CFL (Sattler, Müller, Samek 2020), recursive bi-partitioning by the cosine
similarity of client updates."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.cfl import CFL
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import documents_rule_options, rule_config


@documents_rule_options(CFL.Config)
class CFLStrategy(FederatedStrategy):
    """CFL (Sattler et al. 2020): recursive bi-partitioning by the cosine similarity of updates.

    ``num_clusters`` is the most clusters the splits may create (one at the start). ``eps1`` and
    ``eps2``, the split thresholds, are forwarded into ``CFL.Config``
    ([`CFLConfig`][lightning_fedcluster.algorithms.cfl.CFLConfig]), where they are documented and
    checked.
    """

    strategy_name = "cfl"
    fixed_arguments = ("algorithm",)

    def __init__(self, num_clusters: int = 4, *, eps1: float = 0.4, eps2: float = 1.6, **kwargs: Any) -> None:
        super().__init__(num_clusters, **kwargs)
        self._rule = CFL(num_clusters, rule_config(CFL.Config, locals()))

    @property
    def algorithm(self) -> CFL:
        return self._rule
