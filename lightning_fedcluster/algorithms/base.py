"""The contract between the engine and an algorithm: plain tensors, no Lightning.

An ``Algorithm`` is a ``ClientRule`` and a ``ServerRule``. For one client in one round the
engine asks the client rule for, in order:

1. ``e_step`` (``e_step_many`` for several clients): how much each cluster explains the
   client's data (γ, ω, label sums), from the per-sample losses of the K global models;
2. ``local_plan``: which cluster copies the client trains, with which per-sample weights and
   proximal anchors (FedProx, FedSoft);
3. ``contributions``: after local training, into which cluster each trained copy's update goes
   and with what server weight.

After the round's aggregation the server rule's ``after_round`` sees the server (a read-only
``ServerView``: outcome, client store, global models) and returns actions. What persists between
rounds is in the ``ClientState``; a rule declares its own entries once (``state_entries``).
Optional groups of hooks (estimation, server-side selection, personal models, model distances,
label statistics) are small protocols in ``protocols.py``. Subclasses override only what differs
from the defaults (soft mixture, every active cluster trained, weight N_i).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.client_state import ClientState, StateEntry
from lightning_fedcluster.algorithms.client_turn import ClientContext, ClientReport, Contribution, LocalPlan
from lightning_fedcluster.algorithms.mixture import (
    hard_weights,
    iterate_mixture,
    label_sums,
    mixture_from_responsibilities,
    responsibilities,
    soft_e_step_rows,
)
from lightning_fedcluster.algorithms.protocols import Capabilities
from lightning_fedcluster.algorithms.rule_config import NoOptions, build_config
from lightning_fedcluster.algorithms.server_view import ClientStoreView, ServerView

RoundVectors = Literal["model", "update"]  # what ``after_round`` may read per client (outcome.vectors)

__all__ = [  # the client turn's types are re-exported: rules import them from here
    "Algorithm",
    "ClientContext",
    "ClientReport",
    "ClientRule",
    "Contribution",
    "HardAssignment",
    "LocalPlan",
    "RoundVectors",
    "ServerRule",
    "SoftMixture",
    "argmin_active",
    "masked_log_omega",
    "one_hot",
    "soft_e_step_of_clients",
    "with_omega",
]


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
    """The soft E-step (``ClientRule.e_step``) of several clients in one batched computation;
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


class ClientRule:
    """What a client does in a round, from its per-sample losses under the K global models:
    ``e_step`` (and its batched form ``e_step_many``, which the engine calls), ``local_plan``,
    ``contributions``; and how a client predicts (``prediction_weights``,
    ``unseen_client_mixture``). The defaults are the soft EM mixture of FedEM (C ≡ 1): every
    active cluster trained with γ, server weight N_i, soft prediction, unseen clients by the
    iterated E-step."""

    num_clusters: int
    hard_prediction = False  # predict with the argmax-ω model (an option of the rule's own)

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
        """``e_step`` of several clients; client c owns rows offsets[c]:offsets[c+1]. The engine
        calls this; by default it runs ``e_step`` client by client (``SoftMixture`` batches it)."""
        return [
            self.e_step(losses[a:b], labels[a:b], context, log_label_stats)
            for a, b, context in zip(offsets[:-1].tolist(), offsets[1:].tolist(), contexts, strict=True)
        ]

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        """Train every active cluster with per-sample weights γ (eq. 5 of FedRC)."""
        clusters = tuple(int(k) for k in context.active.nonzero().flatten())
        return LocalPlan(clusters=clusters, sample_weights=report.gamma[:, list(clusters)])

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        """Each trained copy goes back into its own cluster with weight N_i."""
        return [Contribution(k, k, float(context.num_samples)) for k in plan.clusters]

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


class ServerRule:
    """What the server decides: the clusters alive at the start (``initial_active``), the
    per-client vectors it needs after a round (``round_vectors``), and its structural decisions
    after aggregation (``after_round``, from a read-only ``ServerView`` that includes the global
    models), returned as actions; ``check_clients`` refuses options that do not fit the data."""

    num_clusters: int

    def initial_active(self) -> Tensor:
        """Clusters alive at the start (CFL starts with one)."""
        return torch.ones(self.num_clusters, dtype=torch.bool)

    def round_vectors(self, state: ClientState | ClientStoreView | None) -> RoundVectors | None:
        """Which per-client flat vector ``after_round`` reads in ``outcome.vectors`` this round:
        "model" (the locally trained copy), "update" (that copy minus its global model), or None.
        (A rule with ``PersonalModels`` gets its clients' personal models instead.)"""
        return None

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """Structural server decisions after aggregation (removal, centres, splits, merges) as
        actions, from a read-only view of the server: the round's outcome, the client store and
        the global cluster models (``algorithms/server_view.py``)."""
        return []

    def check_clients(self, num_clients: int) -> None:
        """Raise a ValueError before training when an option does not fit the datamodule's
        ``num_clients`` clients (e.g. one value per client)."""
        return None


class Algorithm(ClientRule, ServerRule):
    """An algorithm: its client rule, its server rule, the client-store entries it declares
    (``state_entries``) and the optional protocols it derives from (``protocols.py``: estimation,
    server-side selection, personal models, model distances, label statistics), which
    ``capabilities`` reads. Subclasses override only what differs from the defaults."""

    Config: ClassVar[type] = NoOptions  # the rule's options (``rule_config.py``)

    def __init__(self, num_clusters: int, config: Any = None, **options: Any) -> None:
        """K, and the rule's options: a ready ``config=`` (a ``type(self).Config``) or its fields
        as keywords; the rule reads them from ``self.config``."""
        self.num_clusters = num_clusters
        self.config = build_config(type(self).__name__, self.Config, config, options)

    @property
    def capabilities(self) -> Capabilities:
        """Which optional protocols this rule implements (``Capabilities.of``, the one place)."""
        return Capabilities.of(self)

    def state_entries(self) -> tuple[StateEntry, ...]:
        """The algorithm-specific client-store entries (besides ω, label sums and participation):
        name, scope (per client, per sample, per cluster, for the run), shape, initial value,
        whether clients report it and whether it is a mixture over clusters."""
        return ()


class SoftMixture(Algorithm):
    """The soft EM mixture with its E-step batched over a chunk of clients (one computation for
    the vectorised executor's chunk). A subclass that changes the E-step overrides both
    ``e_step`` and ``e_step_many`` (FedRC does)."""

    def e_step_many(
        self,
        losses: Tensor,
        labels: Tensor,
        offsets: Tensor,
        contexts: list[ClientContext],
        log_label_stats: Tensor | None,
    ) -> list[ClientReport]:
        return soft_e_step_of_clients(losses, labels, offsets, contexts, log_label_stats)


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
