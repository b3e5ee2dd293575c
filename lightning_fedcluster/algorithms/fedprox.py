"""FedAvg (McMahan et al., AISTATS 2017, Algorithm 1) and FedProx (Li et al., MLSys 2020,
Algorithm 2); baselines in FedRC's Section 5. Plain tensors.

One model, weight N_i; FedProx adds (μ/2)‖w − θ‖² to the local loss, and FedAvg is FedProx
with μ = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lightning_fedcluster.algorithms.assignment import assignment_report
from lightning_fedcluster.algorithms.base import ClientContext, ClientReport, HardAssignment, LocalPlan
from lightning_fedcluster.arguments import number_arg


@dataclass(frozen=True)
class FedProxConfig:
    """FedProx's option, ``FedProx.Config``.

    Args:
        mu: μ of the proximal term (μ/2)‖w − θ‖² in the local loss; 0 is FedAvg.
    """

    mu: float = 0.01

    def __post_init__(self) -> None:
        number_arg("mu", self.mu)


class FedProx(HardAssignment):
    """FedProx and FedAvg (``mu=0``): one model trained by every client, weight N_i, proximal
    term (μ/2)‖w − θ‖² in the local loss. ``FedProx(mu)``, or ``FedProx(config=FedProx.Config(...))``."""

    Config = FedProxConfig
    config: FedProxConfig

    def __init__(self, mu: float | None = None, *, config: FedProxConfig | None = None) -> None:
        super().__init__(1, config, **({} if mu is None else {"mu": mu}))

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        return assignment_report(0, losses, labels, context.num_classes)

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        mu = self.config.mu
        proximal = (((0, mu),),) if mu > 0 else ()
        return LocalPlan(clusters=(0,), proximal=proximal)
