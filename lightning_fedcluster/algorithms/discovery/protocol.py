"""The protocol of a concept-discovery mechanism: one client-side hook, one server-side hook, the
client-store entries it declares.

A mechanism that finds the concepts (a grouping of the clients, a merge, a retirement, the weight
of a copy on the server) is a ``Component``. A rule holds its components in a declared order and
runs them (``discovery/runner.py``): on the client, after the rule's own E-step, each component's
``client`` hook sees the turn (``ClientTurn``: the report, the losses, the labels, the context) and
may return a changed copy, e.g. a report with γ set to ω, or the copies to train and their server
weights; on the server, after a round's aggregation, each component's ``actions`` hook sees the
server (``DiscoveryView``) and returns actions (``algorithms/actions.py``). A component that
decides K (``decisive``) ends the round's decisions when it acts, so that one K decision is taken
per round, from the store as it was after the round. What a component keeps between rounds is
declared once (``state_entries``); the rule declares the union, each entry once.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.client_state import Scope, StateEntry
from lightning_fedcluster.algorithms.client_turn import ClientContext, ClientReport
from lightning_fedcluster.algorithms.server_view import ClientStoreView, RoundOutcome, ServerView

CLUSTER_SCORES = "cluster_scores"
"""The client-store entry of each client's mean E-step score per cluster [K] (``wants_scores``)."""


@dataclass(frozen=True)
class ClientTurn:
    """One client's E-step as the components see it, in order; each may return a changed copy.

    ``report``: γ [N, K], ω [K] and the label sums (the E-step's, or a previous component's);
    ``losses``: [N, K] per-sample losses f_jk; ``labels``: [N]; ``log_label_stats``: log C_{y,k}
    [C, K] (None for FedEM); ``context``: the round index, the previous ω, the alive clusters,
    ``extra`` (this client's declared state, writable) and ``outputs`` (the K models' class
    probabilities, for a component that ``wants_outputs``); ``train_clusters``: None for the
    rule's own plan, else the copies the client trains (each sample with weight 1);
    ``copy_weights``: [K] multipliers m_k, copy k enters the server's sum with weight N_i · m_k
    (None: N_i, or the rule's own)."""

    report: ClientReport
    losses: Tensor
    labels: Tensor
    log_label_stats: Tensor | None
    context: ClientContext
    train_clusters: tuple[int, ...] | None = None
    copy_weights: Tensor | None = None


@dataclass(frozen=True)
class TurnReport(ClientReport):
    """A report that carries a turn's ``train_clusters`` and ``copy_weights`` (``ClientTurn``) from
    the E-step to the rule's plan and contributions: the report is what every executor (and a
    Flower node) hands from one to the others for each client."""

    train_clusters: tuple[int, ...] | None = None
    copy_weights: Tensor | None = None


@dataclass(frozen=True)
class DiscoveryView:
    """What a component's server hook sees after a round's aggregation: the server (its round's
    ``outcome``, the client store ``state``, the cluster models) and the run's rounds
    (``num_rounds``: ``max_epochs``; None when unbounded)."""

    server: ServerView
    num_rounds: int | None = None

    @property
    def round_index(self) -> int:
        return self.server.outcome.round_index

    @property
    def outcome(self) -> RoundOutcome:
        return self.server.outcome

    @property
    def state(self) -> ClientStoreView:
        return self.server.client_state


class Component(ABC):  # noqa: B024 - every hook has a default: a component overrides what it uses
    """A concept-discovery mechanism (see the module docstring).

    ``decisive``: it decides K; once it returns actions in a round, the later components' are
    skipped. ``wants_outputs``: its client hook reads ``context.outputs``. ``wants_scores``: it
    reads each client's mean E-step score per cluster (``CLUSTER_SCORES``, which the rule computes
    and declares)."""

    decisive: ClassVar[bool] = False
    wants_outputs: ClassVar[bool] = False
    wants_scores: ClassVar[bool] = False

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        """The client-store entries this component keeps between rounds."""
        return ()

    def client(self, turn: ClientTurn) -> ClientTurn:
        """The client-side hook: the turn, or a changed copy (``dataclasses.replace``)."""
        return turn

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """The server-side hook after a round's aggregation: the actions to apply (none by default)."""
        return []

    def check(self, rule: Any) -> None:  # noqa: B027 - optional hook, nothing to check by default
        """ValueError, before training, for a rule this component cannot serve."""


def scores_entry(num_clusters: int) -> StateEntry:
    """The client-store entry of each client's mean E-step score per cluster [K], reported."""
    return StateEntry(CLUSTER_SCORES, Scope.CLIENT, (num_clusters,), reported=True)


def client_scores(losses: Tensor, labels: Tensor, log_label_stats: Tensor | None) -> Tensor:
    """A client's mean E-step score per cluster [K]: mean_j (−f_jk − log C_{y_j,k})."""
    scores = -losses.to(torch.float64)
    if log_label_stats is not None:
        scores = scores - log_label_stats.to(scores)[labels]
    return scores.mean(0)


def cluster_shares(omega: Tensor, sizes: Tensor, seen: Tensor) -> Tensor:
    """[K] share of the seen clients' data each cluster explains: Σ_i N_i ω_ik / Σ_i N_i."""
    weights = sizes[seen].to(torch.float64)
    return (omega[seen].to(torch.float64) * weights.unsqueeze(1)).sum(0) / weights.sum()
