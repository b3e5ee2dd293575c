"""FedSoftStrategy: soft clustering with proximal local updates and persistent personal models."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.fedsoft import IMPORTANCE_FLOOR, FedSoft
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import documents_rule_options, rule_config


@documents_rule_options(FedSoft.Config)
class FedSoftStrategy(FederatedStrategy):
    """FedSoft (Ruan & Joe-Wong, AAAI 2022).

    ``proximal``, ``selection_size``, ``estimation_interval`` and ``smoother`` are FedSoft's
    options, forwarded into ``FedSoft.Config``
    ([`FedSoftConfig`][lightning_fedcluster.algorithms.fedsoft.FedSoftConfig]), where they are documented
    and checked. ``clients_per_round`` does not apply: the server picks ``selection_size``
    clients per cluster.

    Each client's personal model persists on the CPU (M × model size) and gives its local accuracy.
    """

    strategy_name = "fedsoft"
    fixed_arguments = ("algorithm", "clients_per_round")

    def __init__(
        self,
        num_clusters: int = 2,
        *,
        proximal: float = 1.0,
        selection_size: int = 10,
        estimation_interval: int = 2,
        smoother: float = IMPORTANCE_FLOOR,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("clients_per_round") is not None:
            raise ValueError(
                "FedSoftStrategy picks clients per cluster from the importance weights: use selection_size, "
                "not clients_per_round"
            )
        super().__init__(num_clusters, **kwargs)
        self._rule = FedSoft(num_clusters, rule_config(FedSoft.Config, locals()))

    @property
    def algorithm(self) -> FedSoft:
        return self._rule
