"""DFedEMStrategy: D-FedEM (Marfoq et al., NeurIPS 2021, the fully decentralised variant of
FedEM)."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.dfedem import DFedEM
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import documents_rule_options, rule_config


@documents_rule_options(DFedEM.Config)
class DFedEMStrategy(FederatedStrategy):
    """D-FedEM (Marfoq et al. 2021): FedEM without a server. Every client keeps its own K models
    (on the CPU) and, after each round, averages them with its neighbours on a seeded random
    connected graph (Metropolis–Hastings weights). Every client takes part in every round.

    ``edge_probability`` is forwarded into ``DFedEM.Config``
    ([`DFedEMConfig`][lightning_fedcluster.algorithms.dfedem.DFedEMConfig], where it is documented and
    checked) with the strategy's ``seed``.
    """

    strategy_name = "dfedem"
    fixed_arguments = ("algorithm", "clients_per_round")

    def __init__(self, num_clusters: int = 3, *, edge_probability: float = 0.2, **kwargs: Any) -> None:
        if kwargs.get("clients_per_round") is not None:
            raise ValueError(
                "DFedEMStrategy is fully decentralised: every client trains each round, drop "
                "clients_per_round"
            )
        super().__init__(num_clusters, **kwargs)
        self._rule = DFedEM(num_clusters, rule_config(DFedEM.Config, locals(), seed=self.seed))

    @property
    def algorithm(self) -> DFedEM:
        return self._rule
