"""FedSoft (Ruan & Joe-Wong, AAAI 2022): plain tensors only.

Every τ rounds each client counts, per sample, which cluster model has the lowest loss:
u_ik = max(n_ik / N_i, σ). The server turns u into selection probabilities
v_ki = u_ik N_i / Σ_i' u_i'k N_i' and, for every cluster k, draws ``selection_size`` clients without
replacement with probabilities v_k·; the union trains. A selected client updates its persistent
personal model w_i on f_i(w_i) + (λ/2) Σ_k u_ik ‖w_i − θ_k‖², and θ_k becomes the mean of the w_i
of the clients selected for k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Reassign, ServerAction, SetState
from lightning_fedcluster.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientReport,
    Contribution,
    LocalPlan,
    one_hot,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.mixture import label_sums
from lightning_fedcluster.algorithms.protocols import Estimation, PersonalModels, ServerSelection
from lightning_fedcluster.algorithms.seeds import FEDSOFT_SELECTION, derive_seed
from lightning_fedcluster.algorithms.server_view import ClientStoreView
from lightning_fedcluster.arguments import check_positive_int, number_arg

IMPORTANCE_FLOOR = 1e-4  # σ, the paper's counter smoother


def importance_weights(losses: Tensor, active: Tensor, smoother: float = IMPORTANCE_FLOOR) -> Tensor:
    """u_k = max(n_k / N, σ) with n_k the samples whose lowest loss is cluster k's. ``losses`` [N, K].
    Removed clusters get 0."""
    masked = torch.where(active.to(losses.device), losses.to(torch.float64), torch.inf)
    winners = torch.argmin(masked, dim=1)
    counts = torch.bincount(winners, minlength=losses.shape[1]).to(torch.float64)
    u = (counts / max(losses.shape[0], 1)).clamp_min(smoother)
    return u * active.to(u)


def selection_probabilities(importance: Tensor, sizes: Tensor) -> Tensor:
    """v [K, M]: v_ki = u_ik N_i / Σ_i' u_i'k N_i' (each row sums to 1)."""
    mass = importance.to(torch.float64) * sizes.to(torch.float64).unsqueeze(1)  # [M, K]
    total = mass.sum(0, keepdim=True)
    uniform = torch.full_like(mass, 1.0 / mass.shape[0])
    return torch.where(total > 0, mass / total.clamp_min(torch.finfo(mass.dtype).tiny), uniform).T


def select_clients(
    importance: Tensor, sizes: Tensor, selection_size: int, active: Tensor, generator: torch.Generator
) -> Tensor:
    """Membership [M, K] bool: for each active cluster, ``selection_size`` clients drawn without
    replacement with probabilities v_k·."""
    v = selection_probabilities(importance, sizes)
    membership = torch.zeros(importance.shape[0], importance.shape[1], dtype=torch.bool)
    for k in active.nonzero().flatten().tolist():
        probabilities = v[k].clamp_min(0)
        positive = int((probabilities > 0).sum())
        count = min(selection_size, positive)
        if count == 0:
            continue
        chosen = torch.multinomial(probabilities.float(), count, replacement=False, generator=generator)
        membership[chosen, k] = True
    return membership


@dataclass(frozen=True)
class FedSoftConfig:
    """FedSoft's options, ``FedSoft.Config``.

    Args:
        proximal: λ of the proximal term (λ/2) Σ_k u_ik ‖w_i − θ_k‖².
        selection_size: clients drawn per cluster and round (the server picks them from the
            importance weights; a strategy's ``clients_per_round`` does not apply).
        estimation_interval: τ, rounds between importance estimations (all clients).
        smoother: σ, the floor of the importance weights.
    """

    proximal: float = 1.0
    selection_size: int = 10
    estimation_interval: int = 2
    smoother: float = IMPORTANCE_FLOOR

    def __post_init__(self) -> None:
        check_positive_int("selection_size", self.selection_size)
        check_positive_int("estimation_interval", self.estimation_interval)
        number_arg("proximal (λ)", self.proximal)
        if number_arg("smoother (σ)", self.smoother, strict=True) >= 1:
            raise ValueError(f"smoother (σ) must be in (0, 1), got {self.smoother!r}")


class FedSoft(Algorithm, Estimation, ServerSelection, PersonalModels):
    """FedSoft's rules; options in [`FedSoftConfig`][lightning_fedcluster.algorithms.fedsoft.FedSoftConfig]
    (``FedSoft.Config``). Each client's
    personal model persists on the CPU (M × model size) and gives its local accuracy."""

    Config = FedSoftConfig
    config: FedSoftConfig

    def state_entries(self) -> tuple[StateEntry, ...]:
        """Each client's importance weights u (set by the server's estimation passes) and the
        round of the last pass."""
        return (
            StateEntry("importance", Scope.CLIENT, (self.num_clusters,), initial=1.0 / self.num_clusters),
            StateEntry("estimated_round", Scope.SCALAR, initial=-1.0),
        )

    def needs_estimation(self, round_index: int, state: ClientState | None) -> bool:
        """Every τ rounds, once (a resumed run does not repeat a stored estimation)."""
        if state is None or round_index % self.config.estimation_interval != 0:
            return False
        return int(state.extra["estimated_round"]) != round_index

    def estimate(self, losses: Tensor, active: Tensor) -> Tensor:
        return importance_weights(losses, active, self.config.smoother)

    def after_estimation(
        self, state: ClientStoreView, estimates: Tensor, round_index: int
    ) -> list[ServerAction]:
        """The importance weights u become every client's ω (normalised) and drive selection."""
        return [
            SetState("importance", estimates),
            SetState("estimated_round", torch.tensor(float(round_index))),
            Reassign(torch.arange(estimates.shape[0]), estimates / estimates.sum(1, keepdim=True)),
        ]

    def round_membership(self, round_index: int, state: ClientState, sizes: Tensor, seed: int) -> Tensor:
        generator = torch.Generator().manual_seed(derive_seed(seed, round_index, FEDSOFT_SELECTION))
        return select_clients(
            state.extra["importance"], sizes, self.config.selection_size, state.active, generator
        )

    def max_clients_per_round(self, num_clients: int) -> int:
        return min(num_clients, self.config.selection_size * self.num_clusters)

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        """FedSoft has no per-round E-step: it reports its latest importance weights u (normalised
        as ω), estimated every τ rounds by `importance_weights`."""
        u = context.extra["importance"].to(torch.float64)
        omega = u / u.sum()
        gamma = omega.unsqueeze(0).expand(losses.shape[0], -1).clone()
        return ClientReport(
            gamma=gamma, omega=omega, label_sums=label_sums(gamma, labels, context.num_classes)
        )

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        """One personal model, anchored to every active centre with weight λ u_ik."""
        u = context.extra["importance"]
        anchors = tuple(
            (k, self.config.proximal * float(u[k])) for k in context.active.nonzero().flatten().tolist()
        )
        return LocalPlan(clusters=(0,), proximal=(anchors,), from_personal=True)

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        """The personal model goes, with weight 1, into every cluster that selected the client."""
        assert context.membership is not None, "FedSoft's clients are chosen by round_membership"
        selected = context.membership
        return [Contribution(0, k, 1.0) for k in selected.nonzero().flatten().tolist()]

    def initial_personal_cluster(self, context: ClientContext) -> int:
        """A client without a personal model starts from the centre it weighs most."""
        u = context.extra["importance"]
        return int(torch.argmax(u))

    def unseen_client_mixture(
        self, losses: Tensor, labels: Tensor, log_label_stats: Tensor | None, active: Tensor | None = None
    ) -> Tensor:
        """Normalised importance weights of the new client's data (its share of best-fit samples)."""
        active = torch.ones(losses.shape[1], dtype=torch.bool) if active is None else active
        counts = importance_weights(losses, active, 0.0)
        if float(counts.sum()) == 0:
            return one_hot(0, losses.shape[1], counts)
        return counts / counts.sum()
