"""FedRCStrategy: robust clustering that separates concepts, not label or feature styles."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.strategies.federated import FederatedStrategy


class FedRCStrategy(FederatedStrategy):
    """FedRC (Guo, Tang, Lin, ICML 2024). ``num_clusters=1`` is FedAvg.

    Args:
        hard_prediction: predict with the argmax-ω model only (the paper's TeHC) instead of the
            ω-weighted mixture.
        other arguments: see :class:`FederatedStrategy`.
    """

    strategy_name = "fedrc"

    def __init__(self, num_clusters: int = 3, *, hard_prediction: bool = False, **kwargs: Any) -> None:
        super().__init__(num_clusters, **kwargs)
        self.hard_prediction = hard_prediction
        self._rule = FedRC(num_clusters, use_label_stats=True, hard_prediction=hard_prediction)

    @property
    def algorithm(self) -> FedRC:
        return self._rule
