"""Server-side optimizers (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): the
server treats a cluster's averaged client update Δ = Σ_i w_i (θ_i − θ) / Σ_i w_i as a
pseudo-gradient (a descent direction, so it is added) and keeps its own state per cluster.

- ``"momentum"`` (FedAvgM, Hsu et al. 2019): v ← β v + Δ, then θ ← θ + η_g v.
- ``"adam"`` (FedAdam, Reddi et al. Alg. 2, without bias correction): m ← β₁ m + (1 − β₁) Δ,
  v ← β₂ v + (1 − β₂) Δ², then θ ← θ + η_g m / (√v + τ), with v starting at τ².

Plain tensors only; the engine keeps the state (``engine/server_optimizer_state.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from torch import Tensor

from lightning_fedcluster.arguments import fraction_arg, number_arg

ServerOptimizerKind = Literal["none", "momentum", "adam"]
SERVER_OPTIMIZERS: tuple[str, ...] = get_args(ServerOptimizerKind)
# Reddi et al.'s defaults: β₁ = 0.9, β₂ = 0.99, τ = 1e-3; FedAvgM's β = 0.9.
DEFAULT_MOMENTUM, DEFAULT_BETAS, DEFAULT_TAU = 0.9, (0.9, 0.99), 1e-3


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """Which server optimizer and its hyperparameters (validated on construction)."""

    kind: ServerOptimizerKind = "none"
    momentum: float = DEFAULT_MOMENTUM
    betas: tuple[float, float] = DEFAULT_BETAS
    tau: float = DEFAULT_TAU

    def __post_init__(self) -> None:
        if self.kind not in SERVER_OPTIMIZERS:
            raise ValueError(f"server_optimizer must be one of {SERVER_OPTIMIZERS}, got {self.kind!r}")
        fraction_arg("server_momentum", self.momentum)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"server_betas must be two numbers (β₁, β₂) in [0, 1), got {self.betas!r}")
        for beta in self.betas:
            fraction_arg("server_betas", beta)
        number_arg("server_tau", self.tau, strict=True)

    @classmethod
    def from_arguments(
        cls,
        kind: str,
        momentum: float | None,
        betas: tuple[float, float] | None,
        tau: float | None,
    ) -> ServerOptimizerConfig:
        """The strategy's arguments; a hyperparameter of another server optimizer is refused."""
        given = {"server_momentum": momentum, "server_betas": betas, "server_tau": tau}
        uses = {"none": (), "momentum": ("server_momentum",), "adam": ("server_betas", "server_tau")}
        extra = [
            name for name, value in given.items() if value is not None and name not in uses.get(kind, ())
        ]
        if kind in uses and extra:
            raise ValueError(
                f"{', '.join(extra)} applies to another server optimizer than server_optimizer={kind!r} "
                "(server_momentum: 'momentum'; server_betas, server_tau: 'adam')"
            )
        return cls(
            kind,
            DEFAULT_MOMENTUM if momentum is None else momentum,
            DEFAULT_BETAS if betas is None else tuple(betas),
            DEFAULT_TAU if tau is None else tau,
        )

    def state_names(self) -> tuple[str, ...]:
        """The state tensors kept per federated tensor."""
        return {"none": (), "momentum": ("velocity",), "adam": ("m", "v")}[self.kind]

    def initial(self, name: str) -> float:
        """The starting value of state tensor ``name`` (Adam's v starts at τ²)."""
        return self.tau**2 if name == "v" else 0.0


def momentum_direction(update: Tensor, velocity: Tensor, beta: float) -> Tensor:
    """FedAvgM: v ← β v + Δ (in place); the step direction is v."""
    return velocity.mul_(beta).add_(update)


def adam_direction(update: Tensor, m: Tensor, v: Tensor, betas: tuple[float, float], tau: float) -> Tensor:
    """FedAdam: m ← β₁ m + (1 − β₁) Δ, v ← β₂ v + (1 − β₂) Δ² (in place); direction m / (√v + τ)."""
    beta1, beta2 = betas
    m.mul_(beta1).add_(update, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(update, update, value=1 - beta2)
    return m / (v.sqrt() + tau)


def direction(config: ServerOptimizerConfig, update: Tensor, state: dict[str, Tensor]) -> Tensor:
    """The server step direction for one tensor's averaged update (state updated in place)."""
    if config.kind == "momentum":
        return momentum_direction(update, state["velocity"], config.momentum)
    if config.kind == "adam":
        return adam_direction(update, state["m"], state["v"], config.betas, config.tau)
    return update
