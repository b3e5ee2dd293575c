"""The federation core: the round, written once.

``RoundDriver.run_round(r, executor)`` is the one round of every host, over a ``ServerState``
and without a Trainer: ``prepare_round`` (an estimation pass when the rule asks, before the
round's clients are chosen), ``begin_round`` (the round's clients, the global snapshot and the
accumulators), the ``Executor``'s clients' work, and ``end_round`` (sum the processes' updates,
apply them with the server step, store the clients' reports, run the rule's server actions, load
the new global models, step the LR schedulers and prepare the next round). ``run`` loops over
rounds. The executors are the local loop and the vectorised executor
(``engine/executors/``: a Lightning process's share of the clients, or a Flower node's) and the
Flower grid (``flower/server_host.py``: the nodes' replies). The Lightning module runs one
``run_round`` per training batch (Lightning's loop over epochs is the loop over rounds); the
Flower ServerApp calls ``run``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.algorithms.server_view import ClientStoreView, ServerView
from lightning_fedcluster.engine import client_vectors, server_step
from lightning_fedcluster.engine.client_sampling import RoundSchedule
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.lr_schedulers import RoundSchedulers
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.round import Reduce, RoundState
from lightning_fedcluster.engine.runtime import Timer, untimed
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizer, cluster_group
from lightning_fedcluster.engine.setup_checks import check_chance_level, check_loss_growth
from lightning_fedcluster.engine.state_file import OptimizerStateFile
from lightning_fedcluster.engine.task import Task


def initial_client_state(
    plan: TrainingPlan, num_clients: int, num_classes: int, num_samples: int, per_sample: bool = True
) -> ClientState:
    """The client store at the start of a run: ω uniform, no label sums, the rule's declared
    entries (its per-sample entries only with ``per_sample``: a deployment's server never holds
    them) and the clusters it starts alive. The one place a store is created (module, Flower
    server and nodes)."""
    entries = [e for e in plan.rule.state_entries() if per_sample or e.scope != Scope.SAMPLE]
    state = ClientState.initial(num_clients, num_classes, plan.num_clusters, entries, num_samples)
    state.active = plan.rule.initial_active()
    state.optimizer_dtype = plan.optimizer_store_dtype
    if plan.optimizer_state_dir is not None:
        state.optimizer = OptimizerStateFile(plan.optimizer_state_dir, plan.optimizer_store_dtype)
    return state


@dataclass
class ServerState:
    """What the server holds between rounds: the K working copies (holding the global models
    between rounds), the client store, the server optimizer (None: plain averaging) and the
    local solver's LR schedulers (stepped once per round)."""

    copies: ClusterCopies
    client_state: ClientState
    server_optimizer: ServerOptimizer | None
    schedulers: RoundSchedulers


@dataclass(frozen=True)
class ClientDirectory:
    """What the server knows of the clients: training sizes [M], class count (0: regression)
    and the task."""

    train_sizes: Tensor
    num_classes: int
    task: Task

    @property
    def offsets(self) -> Tensor:
        """Row offsets [M + 1] of every client's training samples, in client order."""
        return torch.cat([torch.zeros(1, dtype=torch.long), self.train_sizes.cumsum(0)])


class Executor(Protocol):
    """Who does the clients' work of a round: the local loop, the vectorised executor (a Lightning
    process's share of the round's clients, or a Flower node's) or a Flower grid (the nodes).

    ``train`` puts this executor's share of the round's clients into the round's sums and
    reports (``RoundState``); ``estimate`` scores every client for an estimation pass ([M, K],
    summed over processes); ``reduce`` sums a round over processes (None: the round is whole
    where it was trained)."""

    @property
    def reduce(self) -> Reduce | None: ...

    def train(self, round_state: RoundState) -> None: ...

    def estimate(self, round_index: int, state: ClientState) -> Tensor: ...


EVENTS_TAG = "clusters/events"
"""The logger text tag of a round's server-action notes (``RoundDriver.notes``)."""


class _ActionTarget:
    """A rule's server actions act on the round's global models and the server's store; a
    replaced model restarts its server-optimizer state."""

    def __init__(
        self, server_state: ServerState, global_clusters: list[list[Tensor]], say: Callable[[str], None]
    ) -> None:
        self.client_state = server_state.client_state
        self.global_clusters = global_clusters
        self._optimizer = server_state.server_optimizer
        self.say = say

    def model_replaced(self, cluster: int) -> None:
        if self._optimizer is not None:
            self._optimizer.reset(cluster_group(cluster))


class NoClientsError(RuntimeError):
    """A round in which no client's update was accepted: the run stops."""


def check_sums(round_state: RoundState) -> None:
    """After the all-reduce: every summed update and report is finite (each was checked before it
    entered the sums; a failure here is a process that skipped its checks or a broken reduction)."""
    tensors = [t for deltas in round_state.delta_sum for t in deltas] + list(round_state.delta_shared)
    if not all(bool(torch.isfinite(t).all()) for t in [*tensors, round_state.report.flat]):
        raise FloatingPointError(
            f"round {round_state.round_index + 1}: the round's summed updates are not finite after the "
            "reduction over processes; no process may skip the reply checks (engine/reply_checks.py)"
        )


class RoundDriver:
    """The server side of a run's rounds.

    Args:
        plan: the run's configuration.
        state: the server's state (owned by the caller, which checkpoints it).
        schedule: which clients take part in each round.
        clients: training sizes, class count and task.
        device: where the round's accumulators live.
        optimizer_size: length of a client's persistent optimizer-state vector (None: reset).
        optimizer_in_store: write each client's optimizer state straight into the store as it
            finishes (one process: no round buffer of every client's state to sum).
        personal_vectors: whether the clients' personal models come back to the server (the
            Lightning engine keeps them in its store; Flower nodes keep their own).
        num_rounds: rounds in the run (None: unbounded); no estimation pass after the last.
        say: where actions' notes go (rank zero's console, a logger); the notes of the last
            round's server step are also kept in ``notes`` (a host logs them, e.g. to TensorBoard).
        warn: where rejected replies and rounds not applied are reported (every process its own).
        check_action: called with every action before it applies (a deployment refuses what its
            nodes cannot mirror).
        timed: times the server's side of a round as the "aggregation" phase.
    """

    def __init__(
        self,
        plan: TrainingPlan,
        state: ServerState,
        schedule: RoundSchedule,
        clients: ClientDirectory,
        *,
        device: torch.device | None = None,
        optimizer_size: int | None = None,
        optimizer_in_store: bool = False,
        personal_vectors: bool = True,
        num_rounds: int | None = None,
        say: Callable[[str], None] = print,
        warn: Callable[[str], None] = warnings.warn,
        check_action: Callable[[ServerAction], None] | None = None,
        timed: Timer = untimed,
    ) -> None:
        self.plan, self.state, self.schedule, self.clients = plan, state, schedule, clients
        self.device = device or torch.device("cpu")
        self.optimizer_size, self.personal_vectors = optimizer_size, personal_vectors
        self.optimizer_in_store = optimizer_in_store
        self.num_rounds, self.say, self.warn, self.check_action = num_rounds, say, warn, check_action
        self.notes: list[str] = []
        self.timed = timed
        self.first_loss: float | None = None  # the divergence checks' state (engine/setup_checks.py)
        self.chance_rounds = 0

    @property
    def rule(self) -> Algorithm:
        return self.plan.rule

    # -- the round's sequence ----------------------------------------------------------------
    def run(
        self,
        executor: Executor,
        rounds: Iterable[int],
        after_round: Callable[[RoundState, dict[str, float]], None] | None = None,
    ) -> None:
        """Every round of ``rounds`` (``run_round``), then ``after_round`` with the round and its
        metrics (a host's logging, validation and checkpoints)."""
        for round_index in rounds:
            round_state, metrics = self.run_round(round_index, executor)
            if after_round is not None:
                after_round(round_state, metrics)

    def run_round(self, round_index: int, executor: Executor) -> tuple[RoundState, dict[str, float]]:
        """One round: its clients and accumulators (``begin_round``), the executor's clients' work,
        then ``end_round``. Returns the round and its training metrics."""
        round_state = self.begin_round(round_index)
        executor.train(round_state)
        with self.timed("aggregation"):
            return round_state, self.end_round(round_state, executor)

    def prepare_round(self, round_index: int, executor: Executor) -> None:
        """Server work before a round's clients are chosen: an estimation pass when the rule asks
        (FedSoft, every τ rounds; the executor scores the clients), whose actions apply at once."""
        state, rule = self.state.client_state, self.rule
        if not rule.capabilities.estimation or not rule.needs_estimation(round_index, state):
            return
        estimates = executor.estimate(round_index, state)
        self.apply(rule.after_estimation(ClientStoreView(state), estimates, round_index), [])

    def begin_round(self, round_index: int) -> RoundState:
        """The round's clients, the global snapshot it starts from, its accumulators, the clients
        the server chose per cluster (a rule with server selection) and log C_{y,k} as the round
        starts (a rule with label statistics)."""
        state, rule, sizes = self.state.client_state, self.rule, self.clients.train_sizes
        clients = self.schedule.clients(round_index)
        wants = client_vectors.vector_kind(rule, state)
        sends = wants is not None and (self.personal_vectors or wants != "personal")
        round_state = RoundState(
            round_index,
            clients,
            sizes[clients],
            self.state.copies.snapshot(),
            rule,
            state,
            self.clients.num_classes,
            client_vectors.vector_size(self.state.copies, rule, state) if sends else 0,
            self.device,
            optimizer_size=self.optimizer_size,
            optimizer_in_store=self.optimizer_in_store,
            limits=self.plan.reply_limits,
        )
        if rule.capabilities.server_selection:
            round_state.membership = rule.round_membership(round_index, state, sizes, self.plan.seed)
        stats = label_statistics(rule, state)
        round_state.log_label_stats = None if stats is None else stats.to(self.device)
        return round_state

    def end_round(self, round_state: RoundState, executor: Executor) -> dict[str, float]:
        """Close a round whose clients' work is in ``round_state``: the executor's ``reduce`` sums
        it over processes (None: already complete), then the server step, the clients' reports
        into the store, the rule's actions, the new global models into the working copies, the LR
        schedulers and the next round's preparation. Returns the round's training metrics.

        Rejected replies are warned about (each process its own); a round with fewer accepted
        clients than ``min_clients_per_round`` is not applied (the models stay) and a round with
        none raises ``NoClientsError``: a run must never count a round no client trained."""
        state, rule = self.state.client_state, self.rule
        self.notes = []
        for rejection in round_state.rejections:
            self.warn(rejection)
        if executor.reduce is not None:
            round_state.reduce(executor.reduce)
        check_sums(round_state)
        accepted, rejected = int(round_state.reported_slots().sum()), round_state.rejected_count()
        applied = accepted >= self.plan.min_clients_per_round
        if accepted == 0:
            raise NoClientsError(
                f"round {round_state.round_index + 1} trained no client: of its {len(round_state.clients)} "
                f"clients, {rejected} sent replies that were rejected and the others' never came (see the "
                "warnings above); the run stops rather than count a round without training"
            )
        if applied:
            round_state.apply(self.plan.server_lr, self.state.server_optimizer)
            server_step.record_round(rule, state, round_state, self.clients.offsets)
            outcome = server_step.round_outcome(round_state, self.clients.train_sizes)
            view = ServerView(outcome, state, round_state.global_clusters, self.num_rounds)
            self.apply(rule.after_round(view), round_state.global_clusters)
        else:
            self.warn(
                f"round {round_state.round_index + 1} is not applied: {accepted} client(s) accepted, fewer "
                f"than min_clients_per_round={self.plan.min_clients_per_round} ({rejected} rejected); the "
                "models stay as they were"
            )
        self.state.copies.load((round_state.global_clusters, round_state.global_shared))
        metrics = server_step.round_metrics(round_state, state, self.clients.task)
        metrics["train/rejected"] = float(rejected)
        if applied:
            self.first_loss = check_loss_growth(
                self.first_loss, metrics["train/loss"], round_state.round_index
            )
            self.chance_rounds = check_chance_level(
                self.chance_rounds, metrics, round_state.round_index, self.clients.num_classes
            )
        with warnings.catch_warnings():  # a solver that only the nodes step (Flower) never steps here
            warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
            self.state.schedulers.step(round_state.round_index, metrics)
        following = round_state.round_index + 1
        if self.num_rounds is None or following < self.num_rounds:
            self.prepare_round(following, executor)
        return metrics

    def _note(self, text: str) -> None:
        self.notes.append(text)
        self.say(text)

    def apply(self, actions: list[ServerAction], global_clusters: list[list[Tensor]]) -> None:
        """The rule's server actions, in order, on ``global_clusters`` and the client store."""
        target = _ActionTarget(self.state, global_clusters, self._note)
        for action in actions:
            if self.check_action is not None:
                self.check_action(action)
            action.apply(target)
