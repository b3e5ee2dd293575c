"""FedSoftStrategy: soft clustering with proximal local updates and persistent personal models."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.algorithms.fedsoft import IMPORTANCE_FLOOR, FedSoft
from lightning_fedcluster.arguments import check_positive_int
from lightning_fedcluster.strategies.federated import FederatedStrategy


class FedSoftStrategy(FederatedStrategy):
    """FedSoft (Ruan & Joe-Wong, AAAI 2022).

    Args:
        proximal: λ of the proximal term (λ/2) Σ_k u_ik ‖w_i − θ_k‖².
        selection_size: clients drawn per cluster and round (the server picks them from the
            importance weights; ``clients_per_round`` does not apply).
        estimation_interval: τ, rounds between importance estimations (all clients).
        smoother: σ, the floor of the importance weights.

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
        check_positive_int("selection_size", selection_size)
        check_positive_int("estimation_interval", estimation_interval)
        if not proximal >= 0:
            raise ValueError(f"proximal (λ) must be >= 0, got {proximal!r}")
        if not 0 < smoother < 1:
            raise ValueError(f"smoother (σ) must be in (0, 1), got {smoother!r}")
        super().__init__(num_clusters, **kwargs)
        self.proximal, self.selection_size = proximal, selection_size
        self.estimation_interval, self.smoother = estimation_interval, smoother
        self._rule = FedSoft(
            num_clusters,
            proximal=proximal,
            selection_size=selection_size,
            estimation_interval=estimation_interval,
            smoother=smoother,
        )

    @property
    def algorithm(self) -> FedSoft:
        return self._rule
