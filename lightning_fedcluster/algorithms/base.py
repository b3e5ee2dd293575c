"""The contract between the engine and an algorithm's rules: plain tensors, no Lightning.

For one client in one round the engine asks the rule for, in order:

1. ``e_step``: how much each cluster explains the client's data (γ, ω, label sums), from the
   per-sample losses of the K global models;
2. ``local_plan``: which cluster copies the client trains, with which per-sample weights and
   proximal anchors (FedProx, FedSoft);
3. ``contributions``: after local training, into which cluster each trained copy's update goes
   and with what server weight (FeSEM/WeCFL may move the client to another cluster here).

Everything that must persist between rounds is in the ``ClientState``. Subclasses override
only what differs from the defaults (soft mixture, every active cluster trained, weight N_i).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.mixture import (
    hard_weights,
    iterate_mixture,
    label_sums,
    mixture_from_responsibilities,
    responsibilities,
    soft_e_step_rows,
)
from lightning_fedcluster.algorithms.seeds import derive_seed
from lightning_fedcluster.algorithms.server_view import ServerView


@dataclass(frozen=True)
class ClientReport:
    """One client's E-step: γ [N, K] (stays on the client) and what it reports to the server:
    ω [K] (mixture or one-hot assignment) and label sums S [C, K] (empty for regression)."""

    gamma: Tensor
    omega: Tensor
    label_sums: Tensor


@dataclass(frozen=True)
class LocalPlan:
    """What a client trains this round.

    ``clusters``: the cluster copies it trains, each starting from its global model.
    ``sample_weights``: [N, len(clusters)] weight of each sample in each copy's loss, or None for 1.
    ``proximal``: per trained copy, (anchor cluster, coefficient c) pairs adding (c/2)‖w − θ_anchor‖².
    ``from_personal``: the (single) trained copy starts from the client's personal model (FedSoft).
    """

    clusters: tuple[int, ...]
    sample_weights: Tensor | None = None
    proximal: tuple[tuple[tuple[int, float], ...], ...] = ()
    from_personal: bool = False


@dataclass(frozen=True)
class Contribution:
    """The update of trained copy ``source`` enters cluster ``target`` with server weight ``weight``:
    Δ = θ_local(source) − θ_target."""

    source: int
    target: int
    weight: float


@dataclass(frozen=True)
class ClientContext:
    """What a rule may know about the client besides its losses: ids, size, prior state, RNG."""

    client: int
    round_index: int
    num_samples: int
    num_classes: int
    omega: Tensor  # the client's ω from its last participation (1/K initially)
    active: Tensor  # [K] bool: clusters still alive
    seen: bool = False  # whether the client took part before
    generator: torch.Generator | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)  # algorithm-specific per-client state
    seed_parts: tuple[int, ...] = ()  # seeds ``generator`` on first use when it is not given
    membership: Tensor | None = None  # [K] bool: clusters that chose this client (server selection)

    def rng(self) -> torch.Generator | None:
        """The client's seeded generator, created on first use (seeding costs more than most rules)."""
        if self.generator is None and self.seed_parts:
            seeded = torch.Generator().manual_seed(derive_seed(*self.seed_parts))
            object.__setattr__(self, "generator", seeded)  # frozen dataclass: cache it once
        return self.generator


def masked_log_omega(omega: Tensor, active: Tensor) -> Tensor:
    """log ω with removed clusters at −inf (their responsibility is exactly 0)."""
    log_omega = omega.clamp_min(0).log()
    return torch.where(active.to(omega.device), log_omega, torch.full_like(log_omega, -torch.inf))


def argmin_active(values: Tensor, active: Tensor) -> int:
    """Index of the smallest value among active clusters (lowest index on ties)."""
    masked = torch.where(active.to(values.device), values, torch.full_like(values, torch.inf))
    return int(torch.argmin(masked))


def one_hot(k: int, num_clusters: int, like: Tensor) -> Tensor:
    out = torch.zeros(num_clusters, dtype=like.dtype, device=like.device)
    out[k] = 1.0
    return out


def soft_e_step_of_clients(
    losses: Tensor,
    labels: Tensor,
    offsets: Tensor,
    contexts: list[ClientContext],
    log_label_stats: Tensor | None,
) -> list[ClientReport]:
    """The soft E-step (``Algorithm.e_step``) of several clients in one batched computation;
    client c owns rows offsets[c]:offsets[c+1] of ``losses`` [N, K] and ``labels`` [N]."""
    losses = losses.to(torch.float64)
    omega = torch.stack([context.omega.to(losses) for context in contexts])
    log_omega = masked_log_omega(omega, contexts[0].active)
    gamma, omegas, sums = soft_e_step_rows(
        losses, labels, offsets, log_omega, log_label_stats, contexts[0].num_classes
    )
    bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
    return [
        ClientReport(gamma=gamma[a:b], omega=omegas[c], label_sums=sums[c]) for c, (a, b) in enumerate(bounds)
    ]


@dataclass(frozen=True)
class Capabilities:
    """What a rule needs of the engine beyond the defaults, declared in one place (the engine
    reads these, never a rule's options).

    ``label_stats``: clients use the server's label statistics C_{y,k} (FedRC; needs class labels).
    ``personal_models``: every client keeps a personal model between rounds (FedSoft, D-FedEM),
    spanning ``personal_copies`` working copies (0: all K). ``model_distances``: after local
    training a client is reassigned by the distances of its model to every global one (FeSEM,
    WeCFL). ``per_sample_state``: client-store entries with one row per training sample, kept
    between rounds (FedRC-Adam's γ and moments); ``per_sample_mixtures``: those of them that are
    distributions over clusters (renormalised when clusters are removed).
    """

    label_stats: bool = False
    personal_models: bool = False
    personal_copies: int = 1
    model_distances: bool = False
    per_sample_state: tuple[str, ...] = ()
    per_sample_mixtures: tuple[str, ...] = ()


class Algorithm:
    """Defaults: the soft EM mixture of FedEM (C ≡ 1), every active cluster trained with γ,
    server weight N_i, soft prediction, unseen clients by the iterated E-step."""

    capabilities = Capabilities()
    hard_prediction = False  # predict with the argmax-ω model (an option of the rule's own)

    def __init__(self, num_clusters: int) -> None:
        self.num_clusters = num_clusters

    # -- client side -------------------------------------------------------------------------
    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        """Soft E-step: γ = softmax_k(log ω − f − log C_y), ω = mean γ, S = per-label sums of γ."""
        losses = losses.to(torch.float64)
        log_omega = masked_log_omega(context.omega.to(losses), context.active)
        log_gamma = responsibilities(losses, labels, log_omega, log_label_stats)
        gamma = log_gamma.exp()
        return ClientReport(
            gamma=gamma,
            omega=mixture_from_responsibilities(log_gamma).exp(),
            label_sums=label_sums(gamma, labels, context.num_classes),
        )

    def e_step_many(
        self,
        losses: Tensor,
        labels: Tensor,
        offsets: Tensor,
        contexts: list[ClientContext],
        log_label_stats: Tensor | None,
    ) -> list[ClientReport]:
        """``e_step`` of several clients at once; client c owns rows offsets[c]:offsets[c+1].

        The soft E-step runs as one batched computation; a subclass that overrides ``e_step``
        is called client by client unless it overrides this too.
        """
        if type(self).e_step is not Algorithm.e_step:
            return [
                self.e_step(losses[a:b], labels[a:b], context, log_label_stats)
                for a, b, context in zip(offsets[:-1].tolist(), offsets[1:].tolist(), contexts, strict=True)
            ]
        return soft_e_step_of_clients(losses, labels, offsets, contexts, log_label_stats)

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        """Train every active cluster with per-sample weights γ (eq. 5 of FedRC)."""
        clusters = tuple(int(k) for k in context.active.nonzero().flatten())
        return LocalPlan(clusters=clusters, sample_weights=report.gamma[:, list(clusters)])

    def reassign(self, report: ClientReport, distances: Tensor, context: ClientContext) -> ClientReport:
        """After local training (only when ``needs_model_distances``): update the assignment."""
        return report

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        """Each trained copy goes back into its own cluster with weight N_i."""
        return [Contribution(k, k, float(context.num_samples)) for k in plan.clusters]

    def check_clients(self, num_clients: int) -> None:
        """Raise a ValueError before training when an option does not fit the datamodule's
        ``num_clients`` clients (e.g. one value per client)."""
        return None

    # -- per-client state beyond ω and label sums ---------------------------------------------
    def initial_extra(self, num_clients: int, num_samples: int) -> dict[str, Tensor]:
        """Algorithm-specific client state: [num_clients, ...] or, for names in ``per_sample_state``,
        [num_samples, ...] tensors (all training samples, in the datamodule's order)."""
        return {}

    def client_reported_state(self) -> tuple[str, ...]:
        """Names of ``initial_extra`` entries a client updates in ``context.extra`` during its turn."""
        return ()

    def initial_active(self) -> Tensor:
        """Clusters alive at the start (CFL starts with one)."""
        return torch.ones(self.num_clusters, dtype=torch.bool)

    def representation_mask(self, parameter_names: list[str]) -> list[bool]:
        """Which parameters form the client representation (``needs_model_distances`` only)."""
        return [True] * len(parameter_names)

    # -- server side -------------------------------------------------------------------------
    def needs_estimation(self, round_index: int, state: ClientState | None) -> bool:
        """Whether every client must estimate its weights before this round (FedSoft, every τ)."""
        return False

    def estimate(self, losses: Tensor, active: Tensor) -> Tensor:
        """One client's estimate [K] in an estimation pass, from its per-sample losses [N, K]."""
        raise NotImplementedError

    def round_membership(
        self, round_index: int, state: ClientState, sizes: Tensor, seed: int
    ) -> Tensor | None:
        """[M, K] bool: which clients train for which cluster this round, when the server picks
        clients from the state (FedSoft); None: the seeded uniform schedule picks them."""
        return None

    def max_clients_per_round(self, num_clients: int) -> int | None:
        """Upper bound of ``round_membership``'s clients per round (None: no server-side selection)."""
        return None

    def initial_personal_cluster(self, context: ClientContext) -> int:
        """The cluster whose model starts a client's personal model (``keeps_personal_models``)."""
        return 0

    def mix_personal(self, personal: dict[int, Tensor], round_index: int) -> None:
        """Server-free mixing of the stored personal models after a round (D-FedEM's gossip)."""
        return None

    def round_vectors(self, state: ClientState | None) -> str | None:
        """Which per-client flat vector the server needs after this round: "personal" (the
        personal model(s), kept in the client store), "model" (the locally trained copy),
        "update" (that copy minus its global model), or None."""
        return "personal" if self.capabilities.personal_models else None

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """Structural server decisions after aggregation (removal, centres, splits, merges) as
        actions, from a read-only view of the server: the round's outcome, the client store and
        the global cluster models (``algorithms/server_view.py``)."""
        return []

    def after_estimation(self, state: ClientState, estimates: Tensor, round_index: int) -> list[ServerAction]:
        """What an estimation pass (``needs_estimation``) changes, from every client's estimate [M, K]."""
        raise NotImplementedError

    def log_label_stats(self, state: ClientState) -> Tensor | None:
        """log C_{y,k} (None: C is constant and drops out)."""
        return None

    def prediction_weights(self, omega: Tensor) -> Tensor:
        """Mixture weights used to predict for a client with mixture ω."""
        return hard_weights(omega) if self.hard_prediction else omega

    def unseen_client_mixture(
        self, losses: Tensor, labels: Tensor, log_label_stats: Tensor | None, active: Tensor | None = None
    ) -> Tensor:
        """ω of a client that never trained, from its labelled data: the E-step iterated to a
        fixed point over the active clusters."""
        losses = losses.to(torch.float64)
        if active is not None and not bool(active.all()):
            omega = torch.zeros(losses.shape[1], dtype=losses.dtype, device=losses.device)
            keep = active.to(losses.device)
            stats = None if log_label_stats is None else log_label_stats[:, keep]
            omega[keep] = iterate_mixture(losses[:, keep], labels, stats)
            return omega
        return iterate_mixture(losses, labels, log_label_stats)


class HardAssignment(Algorithm):
    """Shared by the hard-clustering algorithms: ω is a one-hot assignment; prediction uses the
    assigned model; an unseen client takes the model with the lowest mean loss."""

    hard_prediction = True

    def unseen_client_mixture(
        self, losses: Tensor, labels: Tensor, log_label_stats: Tensor | None, active: Tensor | None = None
    ) -> Tensor:
        losses = losses.to(torch.float64)
        active = torch.ones(losses.shape[1], dtype=torch.bool) if active is None else active
        return one_hot(argmin_active(losses.mean(0), active), losses.shape[1], losses)


def with_omega(report: ClientReport, omega: Tensor) -> ClientReport:
    """The report with another ω (and γ set to the one-hot assignment's columns)."""
    gamma = omega.unsqueeze(0).expand_as(report.gamma).clone()
    return replace(report, omega=omega, gamma=gamma)
