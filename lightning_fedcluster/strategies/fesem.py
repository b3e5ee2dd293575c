"""FeSEMStrategy and WeCFLStrategy: K-means over client models (FeSEM, Xie, Long et al.; WeCFL,
Ma, Long et al. 2022), baselines in FedRC's Section 5."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.fesem import FeSEM
from lightning_fedcluster.strategies.federated import FederatedStrategy


class FeSEMStrategy(FederatedStrategy):
    """FeSEM (Xie, Long et al.): K-means over client models; every member weighs 1.

    Args:
        representation_layers: parameter-name prefixes forming the client representation (default:
            all parameters of the locally trained model).
    """

    strategy_name = "fesem"
    fixed_arguments = ("algorithm",)
    weighted = False

    def __init__(
        self, num_clusters: int = 3, *, representation_layers: Sequence[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(num_clusters, **kwargs)
        layers = None if representation_layers is None else tuple(representation_layers)
        self._rule = FeSEM(num_clusters, weighted=self.weighted, seed=self.seed, representation_layers=layers)

    @property
    def algorithm(self) -> Algorithm:
        return self._rule


class WeCFLStrategy(FeSEMStrategy):
    """WeCFL (Ma, Long et al. 2022): FeSEM with members weighted by their data size N_i."""

    strategy_name = "wecfl"
    weighted = True
