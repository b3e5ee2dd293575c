"""CFLStrategy: CFL (Sattler, Müller, Samek 2020), recursive bi-partitioning by the cosine
similarity of client updates."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.cfl import CFL
from lightning_fedcluster.strategies.federated import FederatedStrategy


class CFLStrategy(FederatedStrategy):
    """CFL (Sattler et al. 2020): recursive bi-partitioning by the cosine similarity of updates.

    Args:
        num_clusters: the most clusters the splits may create (one at the start).
        eps1: split only when the cluster's weighted mean update norm is below this.
        eps2: ... and some member's update norm is above this.
    """

    strategy_name = "cfl"
    fixed_arguments = ("algorithm",)

    def __init__(self, num_clusters: int = 4, *, eps1: float = 0.4, eps2: float = 1.6, **kwargs: Any) -> None:
        if not (eps1 > 0 and eps2 > 0):
            raise ValueError(f"eps1 and eps2 must be > 0, got eps1={eps1!r}, eps2={eps2!r}")
        super().__init__(num_clusters, **kwargs)
        self.eps1, self.eps2 = eps1, eps2
        self._rule = CFL(num_clusters, eps1=eps1, eps2=eps2)

    @property
    def algorithm(self) -> Algorithm:
        return self._rule
