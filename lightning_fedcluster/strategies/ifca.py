"""IFCAStrategy: IFCA (Ghosh et al., NeurIPS 2020, Algorithm 1), a baseline in FedRC's Section 5."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.ifca import IFCA
from lightning_fedcluster.strategies.federated import FederatedStrategy


class IFCAStrategy(FederatedStrategy):
    """IFCA (Ghosh et al. 2020): each client trains only the model with its lowest mean loss."""

    strategy_name = "ifca"
    fixed_arguments = ("algorithm",)

    def __init__(self, num_clusters: int = 3, **kwargs: Any) -> None:
        super().__init__(num_clusters, **kwargs)
        self._rule = IFCA(num_clusters)

    @property
    def algorithm(self) -> Algorithm:
        return self._rule
