"""The loop executor: one client at a time on the K working copies, the user's own optimizer as
the local solver. General (any model, any optimizer, every algorithm); the vectorised executor is
faster for small dense models.

A client's turn (``start_turn``, ``start_personal``, ``turn_step``, ``end_turn``) needs no
Trainer; ``LoopExecutor.train_client`` runs it, for a Lightning process's clients and a Flower
node's alike, with plain autograd and the optimizer itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import ClientContext, ClientReport, LocalPlan
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.seeds import FINETUNE_ORDER
from lightning_fedcluster.allocator import release_free_heap
from lightning_fedcluster.engine import client_vectors
from lightning_fedcluster.engine.client import (
    ClientWork,
    contributions,
    minibatch_order,
    non_finite_error,
    passless_losses,
    prediction_weights_per_row,
    prepare,
    step_metric_sums,
    train_metric_sums,
)
from lightning_fedcluster.engine.client_sampling import derive_seed, epoch_batch, step_rows
from lightning_fedcluster.engine.copies import ClusterCopies, local_optimizer
from lightning_fedcluster.engine.estep_reuse import OPTION, FirstStep, first_step_rows, reused_pass
from lightning_fedcluster.engine.executors.local import (
    LocalClients,
    Processes,
    client_share,
    estimation_pass,
)
from lightning_fedcluster.engine.gradient_clipping import clip_copy_gradients
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.losses import per_sample_loss
from lightning_fedcluster.engine.optimizer_state import load_state, read_state
from lightning_fedcluster.engine.outputs import LogitsFrom, forward_logits
from lightning_fedcluster.engine.round import Reduce, RoundState
from lightning_fedcluster.engine.runtime import ClientRuntime, LocalSetup, LocalSolver, Timer, untimed
from lightning_fedcluster.engine.task import Task


class Copies(Protocol):
    """What the local objective reads: the K models, their federated tensors, task, where the
    logits are in the output, and device (a ``TrainingHost`` or a ``LocalSetup``)."""

    models: nn.ModuleList
    copies: ClusterCopies
    task: Task
    logits_from: LogitsFrom

    @property
    def device(self) -> torch.device: ...


@dataclass
class ClientTurn:
    """One client's turn in progress: its plan (``work``), data, its training metric sums (added
    to the round's once its work is accepted; from its local steps when ``step_metrics``, the turn
    without the E-step pass), minibatch permutation per local epoch, and with
    ``reuse_estep_forward`` the forward its first local step reuses (``first``, until it runs)."""

    work: ClientWork
    x: Tensor
    y: Tensor
    metrics: Tensor
    orders: dict[int, Tensor] = field(default_factory=dict)
    step_metrics: bool = False
    first: FirstStep | None = None


def plan_loss(
    module: Copies,
    plan: LocalPlan,
    trained: Sequence[int],
    x: Tensor,
    y: Tensor,
    weights: Tensor | None,
    size: int,
    anchors: list[list[Tensor]] | None,
    logits: list[Tensor] | None = None,
    losses: Sequence[Tensor] | None = None,
) -> Tensor:
    """The local objective on one minibatch: Σ over the trained copies k of
    (1/B) Σ_j w_jk f(x_j, y_j; θ_k), plus (c/2)‖w_k − θ_anchor‖² per proximal anchor when
    ``anchors`` (the round's global tensors) are given. ``logits``: a list that receives each
    trained copy's raw outputs (detached), for the training metrics. ``losses``: each copy k's
    per-sample losses [B] of this minibatch already forwarded with gradients (``FirstStep``)."""
    total = torch.zeros((), device=module.device)
    for s, k in enumerate(plan.clusters):
        if k not in trained:
            continue
        if losses is not None:
            loss = losses[k]
        else:
            out = None
            if logits is not None:
                out = forward_logits(module.models[k], x, module.logits_from)
                logits.append(out.detach())
            loss = per_sample_loss(module.models[k], x, y, module.task, out, module.logits_from)
        total = total + (loss if weights is None else weights[:, s] * loss).sum() / size
        if anchors is not None and plan.proximal:
            total = total + proximal_term(module, k, plan.proximal[s], anchors)
    return total


def proximal_term(
    module: Copies, k: int, pairs: Sequence[tuple[int, float]], anchors: list[list[Tensor]]
) -> Tensor:
    """Σ (c/2)‖w_k − θ_anchor‖² over the parameters of working copy k."""
    params = module.copies.cluster_tensors(k)[: module.copies.num_params(k)]
    total = torch.zeros((), device=module.device)
    for anchor, coefficient in pairs:
        if coefficient == 0:
            continue
        reference = anchors[anchor][: len(params)]
        squared = sum(((p - r).square().sum() for p, r in zip(params, reference, strict=True)), total)
        total = total + 0.5 * coefficient * squared
    return total


def seed_random_layers(seed: int, device: torch.device) -> None:
    """Seed the generators a client's random layers (dropout etc.) draw from. On a CPU that is the
    CPU generator alone: ``torch.manual_seed`` would also queue a seeding of every accelerator
    generator, recording a stack trace each time (about 0.2 CPU-s a round for 30 clients inside a
    Lightning fit), and the CPU numbers are the same either way."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def start_turn(
    setup: LocalSetup,
    solver: LocalSolver,
    round_state: RoundState,
    x: Tensor,
    y: Tensor,
    context: ClientContext,
    slot: int,
    log_label_stats: Tensor | None,
    stored: tuple[Tensor | None, Tensor | None] = (None, None),
    steps: int = 0,
) -> ClientTurn:
    """The round's global weights into the working copies, the client's optimizer state (fresh,
    or ``stored`` (vector, started flags) with a persistent layout), its E-step pass and plan
    (the client contract with one client), and its training metrics (``train_metric_sums``).
    A rule that reads no losses (``LocalSetup.loss_pass``) gets no pass: its plan is the same, and
    its training metrics come from the local steps (``turn_step``). With
    ``LocalSetup.reuse_estep_forward`` and ``steps`` > 0 local steps, the pass forwards the first
    step's rows with gradients and keeps that forward for the step (``engine/estep_reuse.py``)."""
    release_free_heap()  # the last client's freed activations, so the heap cannot fragment and grow
    client, round_index = context.client, context.round_index
    seed_random_layers(derive_seed(setup.seed, round_index, client), setup.device)  # rank-independent
    setup.copies.load((round_state.global_clusters, round_state.global_shared))
    if solver.layout is None:
        solver.optimizer.state.clear()
    else:
        load_state(solver.optimizer, solver.layout, *stored)
    first = rows = orders = None
    if setup.loss_pass and setup.reuse_estep_forward:
        orders = [minibatch_order(setup.seed, round_index, client, x.shape[0]).to(setup.device)]
        rows = first_step_rows(setup, orders[0], steps)
    if rows is not None:
        losses, outputs, first = reused_pass(setup, x, y, rows)
    elif setup.loss_pass:
        losses, outputs = setup.evaluate(x, y)
    else:
        losses, outputs = passless_losses(x.shape[0], setup.device), None
    offsets = torch.tensor([0, x.shape[0]])
    (work,) = prepare(
        setup.rule, losses, y, offsets, [context], [slot], log_label_stats, setup.seed, outputs, orders
    )
    work.order = work.order.to(setup.device)
    if outputs is None:
        metrics = torch.zeros(3, dtype=torch.float64, device=setup.device)
        return ClientTurn(work, x, y, metrics, {0: work.order}, step_metrics=True)
    weights = prediction_weights_per_row(setup.rule, [work], setup.device)
    metrics = train_metric_sums(outputs, y, weights, setup.task)
    return ClientTurn(work, x, y, metrics, {0: work.order}, first=first)


def turn_step(
    setup: LocalSetup, solver: LocalSolver, turn: ClientTurn, step: int, anchors: list[list[Tensor]]
) -> None:
    """Local step ``step`` of the turn: one minibatch of the plan's loss, one optimizer step (and,
    for a turn without the E-step pass, the step's training metrics)."""
    work = turn.work
    index = batch_index(setup, turn, step)
    weights = None if work.sample_weights is None else work.sample_weights[index]
    solver.zero_grad()
    x, y = turn.x[index], turn.y[index]
    logits: list[Tensor] | None = [] if turn.step_metrics else None
    first, turn.first = turn.first, None
    if first is not None and (step != 0 or not torch.equal(first.rows, index)):
        raise RuntimeError(f"{OPTION}: the kept forward is of step 0's rows, not of local step {step}'s")
    reused = None if first is None else first.losses
    total = plan_loss(setup, work.plan, work.trained, x, y, weights, index.shape[0], anchors, logits, reused)
    if not bool(torch.isfinite(total)):
        raise non_finite_error(work.context.round_index, work.client, f"at local step {step}")
    if logits:
        turn.metrics += step_metric_sums(logits[0].unsqueeze(0), y.unsqueeze(0), None, setup.task)[0]
    solver.backward(total)
    clip_copy_gradients(setup.models, work.trained, setup.gradient_clip_val)
    solver.step()


def batch_index(setup: LocalSetup, turn: ClientTurn, step: int) -> Tensor:
    """The rows of local step ``step``: with ``local_epochs``, the step's batch of its epoch's
    permutation (partial last batch, reshuffled each epoch); with ``local_steps``, batches of
    min(B, N) rows cycling through the round's permutation."""
    work, n, by_epochs = turn.work, turn.x.shape[0], setup.local_epochs is not None
    order = work.order
    if by_epochs:
        epoch = epoch_batch(step, n, setup.batch_size, setup.drop_last)[0]
        if epoch not in turn.orders:
            permutation = minibatch_order(setup.seed, work.context.round_index, work.client, n, epoch)
            turn.orders[epoch] = permutation.to(setup.device)
        order = turn.orders[epoch]
    return step_rows(order, step, setup.batch_size, by_epochs, setup.drop_last)


def finish_turn(
    setup: LocalSetup, solver: LocalSolver, turn: ClientTurn, round_state: RoundState, report: ClientReport
) -> bool:
    """The client's contributions into the round's sums, its report, training metrics and optimizer
    state, once they pass the reply checks (``RoundState.admit``): a rejected client leaves none of
    them. Returns whether they did."""
    work = turn.work
    parts = contributions(setup.rule, work, report)
    updates = [
        (f"cluster {c.target}", setup.copies.cluster_tensors(c.source), round_state.global_clusters[c.target])
        for c in parts
    ]
    if round_state.global_shared and parts:
        updates.append(("shared layers", setup.copies.shared_tensors(), round_state.global_shared))
    if not round_state.admit(work, updates, report.omega):
        return False
    for c in parts:
        round_state.accumulate(c.target, setup.copies.cluster_tensors(c.source), c.weight)
    if round_state.global_shared and parts:
        round_state.accumulate_shared(setup.copies.shared_tensors(), float(work.stop - work.start))
    round_state.record(work, report)
    round_state.add_metrics(turn.metrics)
    if solver.layout is not None:
        vector, started = read_state(solver.optimizer, solver.layout, setup.copies.num_clusters)
        round_state.record_optimizer(work.slot, vector, started)
    return True


def start_personal(
    setup: LocalSetup, turn: ClientTurn, round_state: RoundState, state: ClientState, key: int
) -> None:
    """When the plan asks (FedSoft), the trained copy starts from the client's personal model,
    stored in ``state`` under ``key`` (the client, or its row in a Flower node's store)."""
    if turn.work.plan.from_personal:
        if turn.first is not None:
            raise ValueError(
                f"{OPTION}=True: the plan of client {turn.work.client} starts from its personal model, "
                f"not from the global weights its E-step pass forwarded; set {OPTION}=False"
            )
        clusters = round_state.global_clusters
        client_vectors.load_personal(setup.copies, setup.rule, state, clusters, key, turn.work.context)


def end_turn(
    setup: LocalSetup, solver: LocalSolver, turn: ClientTurn, round_state: RoundState, state: ClientState
) -> None:
    """The end of a client's turn: a rule that reassigns by model distances does (FeSEM, WeCFL),
    then ``finish_turn``, then the client's vector when the rule asks the server for one (an
    accepted client's)."""
    work, report, rule = turn.work, turn.work.report, setup.rule
    if rule.capabilities.model_distances:
        distances = client_vectors.distances(
            setup.copies, rule, round_state.global_clusters, work.plan.clusters[0]
        )
        report = rule.reassign(report, distances, work.context)
    accepted = finish_turn(setup, solver, turn, round_state, report)
    if accepted and round_state.vectors is not None:
        round_state.vectors["vectors"][work.slot] = client_vectors.round_vector(
            setup.copies, rule, state, round_state.global_clusters, work
        )


class LoopExecutor:
    """The loop executor: this process's share of a round's clients, one at a time on the K
    working copies (``train_client``, the one client-step loop of every host: a Lightning
    process's clients and a Flower node's), and the estimation pass over its clients."""

    def __init__(
        self,
        runtime: ClientRuntime,
        clients: LocalClients,
        processes: Processes | None = None,
        timed: Timer = untimed,
    ) -> None:
        self.runtime, self.clients, self.timed = runtime, clients, timed
        self.processes = processes or Processes()
        self.trained: list[tuple[int, int]] = []  # (round, client id) this process trained last round

    @property
    def reduce(self) -> Reduce | None:
        return self.processes.reduce

    def train(self, round_state: RoundState) -> None:
        """This process's share of the round's clients (``client_share``), each through
        ``train_client``."""
        steps = self.clients.steps[round_state.clients]
        share = client_share(steps, self.processes)
        ids = self.clients.ids[round_state.clients[share]].tolist() if share else []
        self.trained = [(round_state.round_index, int(client)) for client in ids]
        for slot in share:
            self.train_client(round_state, slot)

    def train_client(self, round_state: RoundState, slot: int) -> None:
        """The client in ``slot``: the client contract's first half (``start_turn``, then its
        personal model into the trained copy when the plan asks), its local steps, and its
        contributions and report into the round (``end_turn``)."""
        setup, solver, state = self.runtime.setup, self.runtime.solver, round_state.store
        row = int(round_state.clients[slot])
        x, y = self.clients.split(row)
        with self.timed("e_step"):
            context = self.clients.context(setup, round_state, row, setup.num_classes)
            stored = (state.optimizer.get(row), state.optimizer_started[row])
            stats = round_state.log_label_stats
            steps = int(self.clients.steps[row])
            turn = start_turn(setup, solver, round_state, x, y, context, slot, stats, stored, steps)
            start_personal(setup, turn, round_state, state, row)
        with self.timed("local_training"):
            for step in range(steps):
                turn_step(setup, solver, turn, step, round_state.global_clusters)
        with self.timed("aggregation"):
            end_turn(setup, solver, turn, round_state, state)

    def estimate(self, round_index: int, state: ClientState) -> Tensor:
        return estimation_pass(self.runtime.setup, self.clients, state.active, self.processes, self.timed)


def finetune(module: TrainingHost, client: int, epochs: int, log_label_stats: Tensor | None) -> Tensor:
    """FedRC-FT: ``epochs`` local epochs of the client's weighted M-step on the working copies
    (the caller restores them). Returns the client's ω from the E-step before fine-tuning."""
    x, y = module.split("train", client)
    losses, _ = module.evaluate_clusters(x, y)
    context = module.client_context(client, -1, x.shape[0])
    report = module.rule.e_step(losses, y, context, log_label_stats)
    plan = module.rule.local_plan(report, context)
    weights = None if plan.sample_weights is None else plan.sample_weights.float()
    optimizer = local_optimizer(module.models, module.trainer)
    size = min(module.batch_size, x.shape[0])
    clip = None if module.plan is None else module.plan.gradient_clip_val
    generator = torch.Generator().manual_seed(derive_seed(module.seed, client, FINETUNE_ORDER))
    with torch.inference_mode(False), torch.enable_grad():
        module.models.train()
        for _ in range(epochs):
            order = torch.randperm(x.shape[0], generator=generator).to(module.device)
            for start in range(0, x.shape[0], size):
                index = order[start : start + size]
                optimizer.zero_grad()
                batch_weights = None if weights is None else weights[index]
                total = plan_loss(module, plan, plan.clusters, x[index], y[index], batch_weights, size, None)
                total.backward()
                clip_copy_gradients(module.models, plan.clusters, clip)
                optimizer.step()
        module.models.eval()
    return report.omega
