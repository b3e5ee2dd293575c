"""DFedEMStrategy: D-FedEM (Marfoq et al., NeurIPS 2021, the fully decentralised variant of
FedEM)."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.dfedem import DFedEM
from lightning_fedcluster.strategies.federated import FederatedStrategy


class DFedEMStrategy(FederatedStrategy):
    """D-FedEM (Marfoq et al. 2021): FedEM without a server. Every client keeps its own K models
    (on the CPU) and, after each round, averages them with its neighbours on a seeded random
    connected graph (Metropolis–Hastings weights). Every client takes part in every round.

    Args:
        edge_probability: probability of each edge beyond the ring that keeps the graph connected.
    """

    strategy_name = "dfedem"
    fixed_arguments = ("algorithm", "clients_per_round")

    def __init__(self, num_clusters: int = 3, *, edge_probability: float = 0.2, **kwargs: Any) -> None:
        if kwargs.get("clients_per_round") is not None:
            raise ValueError(
                "DFedEMStrategy is fully decentralised: every client trains each round, drop "
                "clients_per_round"
            )
        if not 0 <= edge_probability <= 1:
            raise ValueError(f"edge_probability must be in [0, 1], got {edge_probability!r}")
        super().__init__(num_clusters, **kwargs)
        self.edge_probability = edge_probability
        self._rule = DFedEM(num_clusters, edge_probability=edge_probability, seed=self.seed)

    @property
    def algorithm(self) -> DFedEM:
        return self._rule
