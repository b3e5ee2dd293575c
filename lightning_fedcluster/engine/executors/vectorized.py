"""The vectorised executor: a process's share of a round's clients in chunks. Per chunk, one
no-grad E-step pass over the chunk's concatenated data (the K global models are the same for
every client), the client contract's ``prepare`` on it, all (client, cluster) SGD steps at once
through ``torch.func`` (``engine/batched_steps.py``: the batched form of the loop's local steps)
and one batched accumulation. Same semantics as the loop executor
(E-step, sample weights, minibatch order, SGD rule, proximal terms, contributions); results agree
up to floating-point summation order."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.batched_steps import (
    SGDConfig,
    StepBatch,
    cluster_losses,
    engine_batches,
    epoch_engine_batches,
    expand_clients,
    functional_template,
    local_sgd,
    stack_models,
)
from lightning_fedcluster.engine.client import (
    ClientWork,
    contribution_matrix,
    minibatch_order,
    non_finite_error,
    passless_losses,
    prediction_weights_per_row,
    prepare,
    step_metric_sums,
    train_metric_sums,
)
from lightning_fedcluster.engine.client_sampling import batches_per_epoch
from lightning_fedcluster.engine.estep_reuse import ChunkModels, FirstChunkStep, chunk_reused_pass
from lightning_fedcluster.engine.executors.local import (
    LocalClients,
    Processes,
    chunk_share,
    estimation_pass,
)
from lightning_fedcluster.engine.losses import functional_loss, model_outputs
from lightning_fedcluster.engine.optimizer_state import momentum_offsets
from lightning_fedcluster.engine.outputs import logits_selector
from lightning_fedcluster.engine.round import Reduce, RoundState
from lightning_fedcluster.engine.runtime import ClientRuntime, Timer, untimed


class VectorizedExecutor:
    """This process's share of a round's clients in chunks (``chunk_share``), each chunk's
    E-step, local training and accumulation at once; the estimation pass as the loop's."""

    def __init__(
        self,
        runtime: ClientRuntime,
        clients: LocalClients,
        chunk_size: int,
        stacked_pass_rows: int,
        processes: Processes | None = None,
        timed: Timer = untimed,
    ) -> None:
        self.runtime, self.clients, self.timed = runtime, clients, timed
        self.processes = processes or Processes()
        self.chunk_size, self.stacked_pass_rows = chunk_size, stacked_pass_rows
        self.trained: list[tuple[int, int]] = []  # (round, client id) this process trained last round
        setup = runtime.setup
        model = setup.models[0]
        self.template = functional_template(model)
        self.eval_template = functional_template(model).eval()  # the E-step pass, as the loop's
        self.loss_fn = functional_loss(model, setup.task)
        self.select = logits_selector(setup.logits_from)
        self.names = [name for name, _ in model.named_parameters()]
        self._stacked: tuple[int, dict[str, Tensor], dict[str, Tensor]] | None = None
        self._momentum_offsets: dict[str, list[int]] | None = None

    @property
    def reduce(self) -> Reduce | None:
        return self.processes.reduce

    def estimate(self, round_index: int, state: ClientState) -> Tensor:
        return estimation_pass(self.runtime.setup, self.clients, state.active, self.processes, self.timed)

    def train(self, round_state: RoundState) -> None:
        """This process's chunks of the round's clients, one after the other."""
        rows = round_state.clients
        steps, sizes = self.clients.steps[rows], self.clients.sizes[rows]
        share = chunk_share(steps, sizes, self.chunk_size, self.processes)
        self.trained = [
            (round_state.round_index, int(self.clients.ids[rows[s]])) for chunk in share for s in chunk
        ]
        for chunk in share:
            self.run_chunk(round_state, chunk)

    def round_models(self, round_index: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The K global models stacked [K, ...], once per round: this executor never writes the
        working copies, so they hold the round's global models for every chunk."""
        if self._stacked is None or self._stacked[0] != round_index:
            self._stacked = (round_index, *stack_models(self.runtime.setup.models))
        return self._stacked[1], self._stacked[2]

    def run_chunk(self, round_state: RoundState, slots: list[int]) -> None:
        """E-step, local training and accumulation of the clients in ``slots``. A rule that reads
        no losses (``LocalSetup.loss_pass``) gets no E-step pass: its training metrics come from
        the local steps."""
        setup, round_index = self.runtime.setup, round_state.round_index
        rows = [int(round_state.clients[s]) for s in slots]
        x, y, local_offsets = self.clients.gather(rows)
        k_total = setup.copies.num_clusters
        with self.timed("e_step"):
            params, buffers = self.round_models(round_index)
            outputs = weights = step_sums = first = orders = None
            if setup.loss_pass and setup.reuse_estep_forward:
                orders = [minibatch_order(setup.seed, round_index, int(self.clients.ids[r]), int(n))
                          for r, n in zip(rows, local_offsets.diff().tolist(), strict=True)]  # fmt: skip
                models = ChunkModels(self.template, self.eval_template, params, buffers, self.loss_fn,
                                     self.select, self.stacked_pass_rows)  # fmt: skip
                steps = self.clients.steps[rows]
                losses, raw, first = chunk_reused_pass(setup, models, x, y, local_offsets, orders, steps)
                outputs = torch.stack([model_outputs(raw[k], setup.task) for k in range(k_total)])
            elif setup.loss_pass:
                losses, raw = cluster_losses(
                    self.eval_template,
                    params,
                    buffers,
                    x,
                    y,
                    loss_fn=self.loss_fn,
                    chunk_size=self.stacked_pass_rows,
                    select=self.select,
                )
                outputs = torch.stack([model_outputs(raw[k], setup.task) for k in range(k_total)])
            else:
                losses = passless_losses(x.shape[0], setup.device)
                step_sums = torch.zeros(len(rows), 3, dtype=torch.float64, device=setup.device)
            contexts = [self.clients.context(setup, round_state, row, setup.num_classes) for row in rows]
            stats = round_state.log_label_stats
            works = prepare(
                setup.rule, losses, y, local_offsets, contexts, slots, stats, setup.seed, outputs, orders
            )
            if outputs is not None:
                weights = prediction_weights_per_row(setup.rule, works, setup.device)
        with self.timed("local_training"):
            steps = self.clients.steps[rows]
            trained = self.train_chunk(
                round_state, works, x, y, local_offsets, steps, params, buffers, step_sums, first
            )
            theta, optimizer = trained
            finite = torch.stack([torch.isfinite(t.flatten(2)).all(2) for t in theta.values()]).all(0).all(1)
            if not bool(finite.all()):
                client = works[int((~finite).nonzero()[0])].client
                raise non_finite_error(round_index, client, "in local training")
        with self.timed("aggregation"):
            mix = contribution_matrix(setup.rule, works, k_total).to(setup.device)
            thetas = [theta[name] for name in self.names]
            accepted = round_state.admit_stacked(works, mix, thetas)
            mix[~accepted.to(mix.device)] = 0.0
            round_state.accumulate_stacked(mix, thetas)
            # A rejected client leaves no trace: no report, training metrics or optimizer state.
            admitted = [work for work, ok in zip(works, accepted.tolist(), strict=True) if ok]
            for work in admitted:
                round_state.record(work, work.report)
            if step_sums is not None:
                round_state.add_metrics(step_sums[accepted.to(step_sums.device)].sum(0))
            else:
                assert outputs is not None and weights is not None
                if len(admitted) < len(works):
                    kept = torch.cat([torch.arange(w.start, w.stop) for w in admitted] or [torch.arange(0)])
                    kept = kept.to(y.device)
                    outputs, y, weights = outputs[:, kept], y[kept], weights[kept]
                round_state.add_metrics(train_metric_sums(outputs, y, weights, setup.task))
            if optimizer is not None:
                self.store_momentum(round_state, works, *optimizer, accepted)

    def train_chunk(
        self,
        round_state: RoundState,
        works: list[ClientWork],
        x: Tensor,
        y: Tensor,
        local_offsets: Tensor,
        steps: Tensor,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        step_sums: Tensor | None = None,
        first: FirstChunkStep | None = None,
    ) -> tuple[dict[str, Tensor], tuple[dict[str, Tensor], Tensor] | None]:
        """Every (client, trained copy) pair's local SGD steps; returns θ [C, K, ...] and, with a
        persistent optimizer layout, the momentum buffers [C, K, ...] and started flags [C, K]
        (stored by the caller for the clients whose work is accepted). ``step_sums`` [C, 3]: the
        clients' training metric sums, added to from every local step (one model, copy 0).
        ``first``: the first step's forward, kept by the E-step pass (``reuse_estep_forward``)."""
        setup, solver = self.runtime.setup, self.runtime.solver
        k_total = setup.copies.num_clusters
        weights = torch.zeros(y.shape[0], k_total, device=setup.device)
        proximal = torch.zeros(len(works), k_total, k_total)
        for c, work in enumerate(works):
            for s, k in enumerate(work.plan.clusters):
                if k in work.trained:
                    rows = slice(work.start, work.stop)
                    weights[rows, k] = 1.0 if work.sample_weights is None else work.sample_weights[:, s]
                    for anchor, coefficient in work.plan.proximal[s] if work.plan.proximal else ():
                        proximal[c, k, anchor] += coefficient
        trained = torch.tensor([[k in work.trained for k in range(k_total)] for work in works])
        if setup.local_epochs is None:
            batches = engine_batches(
                x, y, weights, local_offsets, [w.order for w in works], steps, setup.batch_size, trained
            )
        else:
            batches = epoch_engine_batches(
                x, y, weights, local_offsets, self.epoch_orders(works, steps),
                steps, setup.batch_size, setup.drop_last, trained,
            )  # fmt: skip
        first_grads = None
        if first is not None:  # the first step's gradient from the kept forward, for its weights
            batches = iter(batches)
            head = next(batches)
            first_grads = first.gradients(head)
            batches = itertools.chain([head], batches)
        uses_proximal = bool(proximal.any())
        layout = solver.layout
        momentum, started = None, None
        if layout is not None:
            momentum, started = self.stored_momentum(round_state, works, params)
        result = local_sgd(
            self.template,
            expand_clients(params, len(works)),
            buffers,
            batches,
            SGDConfig.from_optimizer(solver.optimizer),  # this round's scheduled lr
            loss_fn=self.loss_fn,
            select=self.select,
            proximal=proximal.to(setup.device) if uses_proximal else None,
            anchors=params if uses_proximal else None,
            momentum_init=momentum,
            started_init=started,
            return_state=layout is not None,
            gradient_clip_val=setup.gradient_clip_val,
            on_step=None if step_sums is None else self.step_metrics(step_sums),
            first_grads=first_grads,
        )
        if layout is None:
            return result, None
        theta, momentum, started = result
        return theta, (momentum, started)

    def step_metrics(self, sums: Tensor) -> Callable[[StepBatch, Tensor], None]:
        """The ``on_step`` of ``local_sgd`` that adds each step's training metrics of copy 0 (the
        one model of a rule without the E-step pass) to ``sums`` [C, 3], padding rows and clients
        that have run their steps left out."""
        task = self.runtime.setup.task

        def add(batch: StepBatch, logits: Tensor) -> None:
            valid = (batch.weights[..., 0] > 0) & batch.active[:, :1]
            sums[: batch.x.shape[0]] += step_metric_sums(logits[:, 0], batch.y, valid, task)

        return add

    def epoch_orders(self, works: list[ClientWork], steps: Tensor) -> list[list[Tensor]]:
        """Each client's permutation for every local epoch it runs this round (the loop's)."""
        setup, orders = self.runtime.setup, []
        for work, count in zip(works, steps.tolist(), strict=True):
            n = work.stop - work.start
            epochs = -(-count // batches_per_epoch(n, setup.batch_size, setup.drop_last))
            round_index = work.context.round_index
            later = [minibatch_order(setup.seed, round_index, work.client, n, e) for e in range(1, epochs)]
            orders.append([work.order, *later])
        return orders

    def momentum_offsets(self) -> dict[str, list[int]]:
        """Where each parameter's momentum buffer of each copy sits in a client's stored state
        (the layout is fixed for the fit: computed once)."""
        if self._momentum_offsets is None:
            layout = self.runtime.solver.layout
            assert layout is not None
            k_total = self.runtime.setup.copies.num_clusters
            self._momentum_offsets = momentum_offsets(layout, self.names, k_total)
        return self._momentum_offsets

    def stored_momentum(
        self, round_state: RoundState, works: list[ClientWork], params: dict[str, Tensor]
    ) -> tuple[dict[str, Tensor], Tensor]:
        """The chunk's persistent momentum buffers [C, K, ...] and started flags [C, K] (each
        client's by its row in the round's store)."""
        offsets, state = self.momentum_offsets(), round_state.store
        momentum = {
            n: torch.zeros(len(works), *p.shape, dtype=p.dtype, device=p.device) for n, p in params.items()
        }
        started = torch.zeros(len(works), state.num_clusters, dtype=torch.bool)
        for c, work in enumerate(works):
            row = int(round_state.clients[work.slot])
            stored = state.optimizer.get(row)
            if stored is None:
                continue
            started[c] = state.optimizer_started[row]
            for name, per_copy in offsets.items():
                numel = params[name][0].numel()
                for k, offset in enumerate(per_copy):
                    momentum[name][c, k] = stored[offset : offset + numel].view_as(params[name][k])
        return momentum, started

    def store_momentum(
        self,
        round_state: RoundState,
        works: list[ClientWork],
        momentum: dict[str, Tensor],
        started: Tensor,
        accepted: Tensor,
    ) -> None:
        """The momentum buffers after training of each client whose work was ``accepted`` [C], in
        the persistent layout (a rejected client keeps the state it started the round with)."""
        layout, device = self.runtime.solver.layout, self.runtime.setup.device
        assert layout is not None
        offsets = self.momentum_offsets()
        for c, work in enumerate(works):
            if not bool(accepted[c]):
                continue
            vector = torch.zeros(layout.size, dtype=torch.float32, device=device)
            for name, per_copy in offsets.items():
                for k, offset in enumerate(per_copy):
                    value = momentum[name][c, k].flatten()
                    vector[offset : offset + value.numel()] = value
            round_state.record_optimizer(work.slot, vector, started[c].cpu())
