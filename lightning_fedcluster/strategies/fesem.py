"""FeSEMStrategy and WeCFLStrategy: K-means over client models (FeSEM, Xie, Long et al.; WeCFL,
Ma, Long et al. 2022), baselines in FedRC's Section 5."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fedcluster.algorithms.fesem import FeSEM
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import documents_rule_options, rule_config


@documents_rule_options(FeSEM.Config)
class FeSEMStrategy(FederatedStrategy):
    """FeSEM (Xie, Long et al.): K-means over client models; every member weighs 1.

    ``representation_layers`` is forwarded into ``FeSEM.Config``
    ([`FeSEMConfig`][lightning_fedcluster.algorithms.fesem.FeSEMConfig], where it is documented and
    checked) with the strategy's ``seed`` and ``weighted`` (False: FeSEM, True: WeCFL).
    """

    strategy_name = "fesem"
    fixed_arguments = ("algorithm",)
    weighted = False

    def __init__(
        self, num_clusters: int = 3, *, representation_layers: Sequence[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(num_clusters, **kwargs)
        config = rule_config(FeSEM.Config, locals(), weighted=self.weighted, seed=self.seed)
        self._rule = FeSEM(num_clusters, config)

    @property
    def algorithm(self) -> FeSEM:
        return self._rule


class WeCFLStrategy(FeSEMStrategy):
    """WeCFL (Ma, Long et al. 2022): FeSEM with members weighted by their data size N_i."""

    strategy_name = "wecfl"
    weighted = True
