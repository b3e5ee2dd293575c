"""The vectorised executor: a chunk of clients as one work item. One no-grad E-step pass over
the chunk's concatenated data (the K global models are the same for every client), the client
contract's ``prepare`` on it, all (client, cluster) SGD steps at once through ``torch.func``
(``algorithms/vectorized.py``) and one batched accumulation. Same semantics as the loop executor
(E-step, sample weights, minibatch order, SGD rule, proximal terms, contributions); results agree
up to floating-point summation order."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedcluster.engine.client import (
    ClientWork,
    contribution_matrix,
    minibatch_order,
    non_finite_error,
    prediction_weights_per_row,
    prepare,
    train_metric_sums,
)
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.losses import functional_loss, model_outputs
from lightning_fedcluster.engine.optimizer_state import momentum_offsets
from lightning_fedcluster.engine.outputs import logits_selector
from lightning_fedcluster.engine.schedule import batches_per_epoch
from lightning_fedcluster.engine.vectorized import (
    SGDConfig,
    cluster_losses,
    engine_batches,
    epoch_engine_batches,
    expand_clients,
    functional_template,
    local_sgd,
    stack_models,
)
from lightning_fedcluster.engine.work_items import ClientChunk


class VectorizedExecutor:
    """Runs one chunk of clients of the round on a TrainingHost."""

    def __init__(self, module: TrainingHost) -> None:
        model = module.models[0]
        self.template = functional_template(model)
        self.eval_template = functional_template(model).eval()  # the E-step pass, as the loop's
        self.loss_fn = functional_loss(model, module.task)
        self.select = logits_selector(module.logits_from)
        self.names = [name for name, _ in model.named_parameters()]
        self._stacked: tuple[int, dict[str, Tensor], dict[str, Tensor]] | None = None
        self._momentum_offsets: dict[str, list[int]] | None = None

    def round_models(
        self, module: TrainingHost, round_index: int
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The K global models stacked [K, ...], once per round: this executor never writes the
        working copies, so they hold the round's global models for every chunk."""
        if self._stacked is None or self._stacked[0] != round_index:
            self._stacked = (round_index, *stack_models(module.models))
        return self._stacked[1], self._stacked[2]

    def run_chunk(self, module: TrainingHost, item: ClientChunk) -> None:
        """E-step, local training and accumulation of the chunk's clients."""
        round_index, clients = item.round, item.clients.tolist()
        slots = item.slots.tolist()
        offsets = module.data["train_offsets"]
        spans = [(int(offsets[c]), int(offsets[c + 1])) for c in clients]
        sizes = torch.tensor([stop - start for start, stop in spans])
        local_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        rows = torch.cat([torch.arange(start, stop) for start, stop in spans]).to(module.device)
        x, y = module.data["train_x"][rows], module.data["train_y"][rows]
        assert module.round is not None
        with module.timed("e_step"):
            params, buffers = self.round_models(module, round_index)
            losses, raw = cluster_losses(
                self.eval_template,
                params,
                buffers,
                x,
                y,
                loss_fn=self.loss_fn,
                chunk_size=module.stacked_pass_rows,
                select=self.select,
            )
            outputs = torch.stack([model_outputs(raw[k], module.task) for k in range(module.num_clusters)])
            contexts = [
                module.client_context(c, round_index, n) for c, n in zip(clients, sizes.tolist(), strict=True)
            ]
            works = prepare(
                module.rule,
                losses,
                y,
                local_offsets,
                contexts,
                slots,
                module.log_label_stats,
                module.seed,
                outputs,
            )
            weights = prediction_weights_per_row(module.rule, works, module.device)
            module.round.add_metrics(train_metric_sums(outputs, y, weights, module.task))
        with module.timed("local_training"):
            steps = module.round_steps(clients)
            theta = self.train(module, works, x, y, local_offsets, steps, params, buffers)
            finite = torch.stack([torch.isfinite(t.flatten(2)).all(2) for t in theta.values()]).all(0).all(1)
            if not bool(finite.all()):
                raise non_finite_error(round_index, clients[int((~finite).nonzero()[0])], "in local training")
        with module.timed("aggregation"):
            mix = contribution_matrix(module.rule, works, module.num_clusters).to(module.device)
            thetas = [theta[name] for name in self.names]
            accepted = module.round.admit_stacked(works, mix, thetas)
            mix[~accepted.to(mix.device)] = 0.0
            module.round.accumulate_stacked(mix, thetas)
            for work, admitted in zip(works, accepted.tolist(), strict=True):
                if admitted:
                    module.round.record(work, work.report)

    def train(
        self,
        module: TrainingHost,
        works: list[ClientWork],
        x: Tensor,
        y: Tensor,
        local_offsets: Tensor,
        steps: Tensor,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
    ) -> dict[str, Tensor]:
        """Every (client, trained copy) pair's local SGD steps; returns θ [C, K, ...]."""
        k_total = module.num_clusters
        weights = torch.zeros(y.shape[0], k_total, device=module.device)
        proximal = torch.zeros(len(works), k_total, k_total)
        for c, work in enumerate(works):
            for s, k in enumerate(work.plan.clusters):
                if k in work.trained:
                    rows = slice(work.start, work.stop)
                    weights[rows, k] = 1.0 if work.sample_weights is None else work.sample_weights[:, s]
                    for anchor, coefficient in work.plan.proximal[s] if work.plan.proximal else ():
                        proximal[c, k, anchor] += coefficient
        trained = torch.tensor([[k in work.trained for k in range(k_total)] for work in works])
        plan = module.plan
        if plan.local_epochs is None:
            batches = engine_batches(
                x, y, weights, local_offsets, [w.order for w in works], steps, module.batch_size, trained
            )
        else:
            batches = epoch_engine_batches(
                x, y, weights, local_offsets, self.epoch_orders(module, works, steps, plan.drop_last),
                steps, module.batch_size, plan.drop_last, trained,
            )  # fmt: skip
        uses_proximal = bool(proximal.any())
        layout = module.optimizer_layout
        momentum, started = (None, None) if layout is None else self.stored_momentum(module, works, params)
        result = local_sgd(
            self.template,
            expand_clients(params, len(works)),
            buffers,
            batches,
            SGDConfig.from_optimizer(module.optimizers().optimizer),  # this round's scheduled lr
            loss_fn=self.loss_fn,
            select=self.select,
            proximal=proximal.to(module.device) if uses_proximal else None,
            anchors=params if uses_proximal else None,
            momentum_init=momentum,
            started_init=started,
            return_state=layout is not None,
        )
        if layout is None:
            return result
        theta, momentum, started = result
        self.store_momentum(module, works, momentum, started)
        return theta

    def epoch_orders(
        self, module: TrainingHost, works: list[ClientWork], steps: Tensor, drop_last: bool
    ) -> list[list[Tensor]]:
        """Each client's permutation for every local epoch it runs this round (the loop's)."""
        orders = []
        for work, count in zip(works, steps.tolist(), strict=True):
            n = work.stop - work.start
            epochs = -(-count // batches_per_epoch(n, module.batch_size, drop_last))
            round_index = work.context.round_index
            later = [minibatch_order(module.seed, round_index, work.client, n, e) for e in range(1, epochs)]
            orders.append([work.order, *later])
        return orders

    def momentum_offsets(self, module: TrainingHost) -> dict[str, list[int]]:
        """Where each parameter's momentum buffer of each copy sits in a client's stored state
        (the layout is fixed for the fit: computed once)."""
        if self._momentum_offsets is None:
            assert module.optimizer_layout is not None
            layout = module.optimizer_layout
            self._momentum_offsets = momentum_offsets(layout, self.names, module.num_clusters)
        return self._momentum_offsets

    def stored_momentum(
        self, module: TrainingHost, works: list[ClientWork], params: dict[str, Tensor]
    ) -> tuple[dict[str, Tensor], Tensor]:
        """The chunk's persistent momentum buffers [C, K, ...] and started flags [C, K]."""
        assert module.client_state is not None and module.optimizer_layout is not None
        offsets = self.momentum_offsets(module)
        state = module.client_state
        momentum = {
            n: torch.zeros(len(works), *p.shape, dtype=p.dtype, device=p.device) for n, p in params.items()
        }
        started = torch.zeros(len(works), module.num_clusters, dtype=torch.bool)
        for c, work in enumerate(works):
            stored = state.optimizer.get(work.client)
            if stored is None:
                continue
            started[c] = state.optimizer_started[work.client]
            for name, per_copy in offsets.items():
                numel = params[name][0].numel()
                for k, offset in enumerate(per_copy):
                    momentum[name][c, k] = stored[offset : offset + numel].view_as(params[name][k])
        return momentum, started

    def store_momentum(
        self, module: TrainingHost, works: list[ClientWork], momentum: dict[str, Tensor], started: Tensor
    ) -> None:
        """Each client's momentum buffers after training, in the persistent layout."""
        assert module.round is not None and module.optimizer_layout is not None
        offsets = self.momentum_offsets(module)
        for c, work in enumerate(works):
            vector = torch.zeros(module.optimizer_layout.size, dtype=torch.float32, device=module.device)
            for name, per_copy in offsets.items():
                for k, offset in enumerate(per_copy):
                    value = momentum[name][c, k].flatten()
                    vector[offset : offset + value.numel()] = value
            module.round.record_optimizer(work.slot, vector, started[c].cpu())
