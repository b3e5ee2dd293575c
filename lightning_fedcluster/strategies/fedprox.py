"""FedProxStrategy and FedAvgStrategy: one model (FedProx, Li et al., MLSys 2020, Algorithm 2;
FedAvg, McMahan et al., AISTATS 2017, Algorithm 1), baselines in FedRC's Section 5."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_fedcluster.algorithms.fedprox import FedProx
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import documents_rule_options, rule_config


@documents_rule_options(FedProx.Config)
class FedProxStrategy(FederatedStrategy):
    """FedProx (Li et al. 2020): one model, local loss plus (μ/2)‖w − θ‖².

    ``mu`` (μ) is forwarded into ``FedProx.Config``
    ([`FedProxConfig`][lightning_fedcluster.algorithms.fedprox.FedProxConfig]), where it is documented and
    checked.
    """

    strategy_name = "fedprox"
    fixed_arguments = ("algorithm",)

    def __init__(self, mu: float = 0.01, **kwargs: Any) -> None:
        num_clusters = kwargs.pop("num_clusters", 1)
        if num_clusters != 1:
            # Switching a clustered configuration to the baseline keeps its num_clusters: say so.
            rank_zero_warn(
                f"{type(self).__name__} trains one model: num_clusters={num_clusters} from the configuration "
                "is not used"
            )
        super().__init__(1, **kwargs)
        self._rule = FedProx(config=rule_config(FedProx.Config, locals()))

    @property
    def algorithm(self) -> FedProx:
        return self._rule


class FedAvgStrategy(FedProxStrategy):
    """FedAvg (McMahan et al. 2017): one model, client updates averaged with weights N_i."""

    strategy_name = "fedavg"
    fixed_arguments = ("algorithm", "mu")

    def __init__(self, **kwargs: Any) -> None:
        if "mu" in kwargs:
            # FedAvg is FedProx with μ = 0: a μ here would be silently dropped or clash with ours.
            raise TypeError(
                f"FedAvgStrategy has no proximal term (mu is fixed at 0), got mu={kwargs['mu']!r}: "
                "use FedProxStrategy(mu=...) for a proximal term"
            )
        super().__init__(mu=0.0, **kwargs)
