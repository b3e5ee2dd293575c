"""Strategies of the hard-clustering and single-model baselines: IFCA, FeSEM, WeCFL, CFL, FedAvg,
FedProx."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.cfl import CFL
from lightning_fedcluster.algorithms.hard import IFCA, FedProx, FeSEM
from lightning_fedcluster.strategies.federated import FederatedStrategy


class IFCAStrategy(FederatedStrategy):
    """IFCA (Ghosh et al. 2020): each client trains only the model with its lowest mean loss."""

    strategy_name = "ifca"

    def __init__(self, num_clusters: int = 3, **kwargs: Any) -> None:
        super().__init__(num_clusters, **kwargs)
        self._rule = IFCA(num_clusters)

    @property
    def algorithm(self) -> Algorithm:
        return self._rule


class FeSEMStrategy(FederatedStrategy):
    """FeSEM (Xie, Long et al.): K-means over client models; every member weighs 1.

    Args:
        representation_layers: parameter-name prefixes forming the client representation (default:
            all parameters of the locally trained model).
    """

    strategy_name = "fesem"
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

    def check_datamodule(self, datamodule: Any) -> None:
        """Reject ``representation_layers`` that match no parameter before training starts."""
        names = [name for name, _ in self.lightning_module.models[0].named_parameters()]
        self._rule.representation_mask(names)


class WeCFLStrategy(FeSEMStrategy):
    """WeCFL (Ma, Long et al. 2022): FeSEM with members weighted by their data size N_i."""

    strategy_name = "wecfl"
    weighted = True


class CFLStrategy(FederatedStrategy):
    """CFL (Sattler et al. 2020): recursive bi-partitioning by the cosine similarity of updates.

    Args:
        num_clusters: the most clusters the splits may create (one at the start).
        eps1: split only when the cluster's weighted mean update norm is below this.
        eps2: ... and some member's update norm is above this.
    """

    strategy_name = "cfl"

    def __init__(self, num_clusters: int = 4, *, eps1: float = 0.4, eps2: float = 1.6, **kwargs: Any) -> None:
        if not (eps1 > 0 and eps2 > 0):
            raise ValueError(f"eps1 and eps2 must be > 0, got eps1={eps1!r}, eps2={eps2!r}")
        super().__init__(num_clusters, **kwargs)
        self.eps1, self.eps2 = eps1, eps2
        self._rule = CFL(num_clusters, eps1=eps1, eps2=eps2)

    @property
    def algorithm(self) -> Algorithm:
        return self._rule


class FedProxStrategy(FederatedStrategy):
    """FedProx (Li et al. 2020): one model, local loss plus (μ/2)‖w − θ‖²."""

    strategy_name = "fedprox"

    def __init__(self, mu: float = 0.01, **kwargs: Any) -> None:
        if kwargs.pop("num_clusters", 1) != 1:
            raise ValueError(f"{type(self).__name__} trains one model: drop num_clusters")
        if not mu >= 0:
            raise ValueError(f"mu must be >= 0, got {mu!r}")
        super().__init__(1, **kwargs)
        self.mu = mu
        self._rule = FedProx(mu)

    @property
    def algorithm(self) -> Algorithm:
        return self._rule


class FedAvgStrategy(FedProxStrategy):
    """FedAvg (McMahan et al. 2017): one model, client updates averaged with weights N_i."""

    strategy_name = "fedavg"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(mu=0.0, **kwargs)
