"""Choosing and running the client executor.

The loop executor simulates one client at a time on the K working copies, one Lightning work
item per local step: general (any optimizer, any model, every algorithm) and right for models
whose kernels are large. For small models the per-step Python and kernel-launch overhead
dominates; the vectorised executor then runs a chunk of clients as one work item: one no-grad
E-step pass over the chunk's concatenated data (the K global models are the same for every
client), the algorithm's per-client rules on plain tensors, all (client, cluster) SGD steps
through ``torch.func`` (``algorithms/vectorized.py``) and one batched aggregation.

``executor="auto"`` picks the vectorised executor only where it is supported and measured
faster: models whose parametrised layers are all ``nn.Linear`` (``benchmarks/
vectorized_executor.py``: 1.7–2.2× for linear and MLP models, 0.5× for the FashionMNIST CNN).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fedcluster.algorithms.schedule import derive_seed
from lightning_fedcluster.algorithms.vectorized import (
    SGDConfig,
    cluster_losses,
    engine_batches,
    expand_clients,
    functional_template,
    local_sgd,
    stack_models,
)

if TYPE_CHECKING:
    from lightning_fedcluster.module import ClusteredModule

EXECUTORS = ("auto", "loop", "vectorized")
DEFAULT_CLIENTS_PER_CHUNK = 64
# Bound on one chunk's stacked working copies (parameters, gradients, momentum: about 4 copies).
CHUNK_MEMORY_BYTES = 512 * 2**20

LossFn = Callable[[Tensor, Tensor], Tensor]


def functional_loss(model: nn.Module, task: str) -> LossFn:
    """The engine's per-sample loss as a function of (outputs, targets), for ``torch.func``:
    the model's ``criterion`` (unreduced), else cross-entropy or the squared error averaged over
    output dimensions (regression)."""
    criterion = getattr(model, "criterion", None)
    if criterion is not None:
        if isinstance(getattr(criterion, "reduction", None), str) and criterion.reduction != "none":
            criterion = copy.copy(criterion)
            criterion.reduction = "none"

        def criterion_loss(out: Tensor, y: Tensor) -> Tensor:
            loss = criterion(out, y)
            return loss.reshape(loss.shape[0], -1).mean(1) if loss.dim() > 1 else loss

        return criterion_loss
    if task == "regression":
        return lambda out, y: (out.reshape(y.shape) - y).square().reshape(y.shape[0], -1).mean(1)
    return lambda out, y: F.cross_entropy(out, y, reduction="none")


def _random_layers(model: nn.Module) -> list[str]:
    return [name for name, sub in model.named_modules() if isinstance(sub, nn.modules.dropout._DropoutNd)]


def only_dense_layers(model: nn.Module) -> bool:
    """Whether every layer that holds parameters is an ``nn.Linear`` (linear models, MLPs)."""
    owners = [sub for sub in model.modules() if any(True for _ in sub.parameters(recurse=False))]
    return bool(owners) and all(isinstance(sub, nn.Linear) for sub in owners)


def vectorized_obstacle(module: ClusteredModule) -> str | None:
    """Why the vectorised executor cannot run this module under its algorithm, or None."""
    rule, model = module.rule, module.models[0]
    name = type(rule).__name__
    if module.shared_layers:
        return "shared_layers (one extractor tied across the K copies) cannot be stacked per client"
    if rule.keeps_personal_models:
        return f"{name} trains per-client personal models"
    if rule.needs_model_distances:
        return f"{name} assigns clients by distances between locally trained models"
    if rule.needs_update_vectors:
        return f"{name} clusters clients by their update vectors"
    if callable(getattr(model, "per_sample_loss", None)):
        return f"{type(model).__name__}.per_sample_loss calls the model itself, which torch.func cannot batch"
    random = _random_layers(model)
    if random:
        return f"random layers ({', '.join(random)}) would draw other numbers than the loop executor"
    try:
        SGDConfig.from_optimizer(module.configure_optimizers())
        functional_template(model)
    except (TypeError, ValueError, NotImplementedError) as error:
        return str(error)
    return None


def _dry_run(module: ClusteredModule, x: Tensor, y: Tensor) -> str | None:
    """One vectorised step on two samples: catches models that ``torch.func`` cannot run."""
    model = module.models[0]
    try:
        params, buffers = stack_models(module.models)
        xb, yb = x[:2].to(module.device), y[:2].to(module.device)
        clients = expand_clients(params, 1)
        weights = torch.ones(1, xb.shape[0], module.num_clusters, device=module.device)
        batch = engine_batches(
            xb,
            yb,
            weights[0],
            torch.tensor([0, xb.shape[0]]),
            [torch.arange(xb.shape[0])],
            torch.tensor([1]),
            xb.shape[0],
        )
        local_sgd(
            functional_template(model),
            clients,
            buffers,
            batch,
            SGDConfig(lr=0.0),
            loss_fn=functional_loss(model, module.task),
        )
    except Exception as error:  # noqa: BLE001 - any failure means: use the loop executor
        return f"torch.func cannot run {type(model).__name__} ({type(error).__name__}: {error})"
    return None


def choose_executor(requested: str, module: ClusteredModule, x: Tensor, y: Tensor) -> str:
    """Resolve ``executor`` ("auto", "loop", "vectorized") for this module, before training.

    ``x``, ``y``: a few training samples for a dry run. "vectorized" that cannot run raises a
    ValueError naming the reason; "auto" falls back to the loop silently (it is a choice, not a loss).
    """
    if requested not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {requested!r}")
    if requested == "loop":
        return "loop"
    if requested == "auto" and not only_dense_layers(module.models[0]):
        return "loop"
    reason = vectorized_obstacle(module) or _dry_run(module, x, y)
    if reason is None:
        return "vectorized"
    if requested == "vectorized":
        raise ValueError(
            f"executor='vectorized' cannot run this setup: {reason}; use executor='loop' or 'auto'"
        )
    return "loop"


def chunk_size_for(module: ClusteredModule, requested: int | None) -> int:
    """Clients per vectorised work item: ``requested``, else the default bounded by memory."""
    if requested is not None:
        return requested
    per_client = (
        4 * module.num_clusters * sum(p.numel() * p.element_size() for p in module.models[0].parameters())
    )
    return max(1, min(DEFAULT_CLIENTS_PER_CHUNK, CHUNK_MEMORY_BYTES // max(per_client, 1)))


class VectorizedExecutor:
    """Runs one chunk of clients of the round on a ClusteredModule (see the module docstring).

    Same semantics as the loop executor: the same E-step, sample weights, minibatch order,
    local SGD rule (fresh optimizer state per client), proximal terms and server contributions;
    results agree with the loop up to floating-point summation order.
    """

    def __init__(self, module: ClusteredModule) -> None:
        model = module.models[0]
        self.template = functional_template(model)
        self.eval_template = functional_template(model).eval()  # the E-step pass, as the loop's
        self.loss_fn = functional_loss(model, module.task)
        self.config = SGDConfig.from_optimizer(module.optimizers().optimizer)
        self.names = [name for name, _ in model.named_parameters()]
        self._stacked: tuple[int, dict[str, Tensor], dict[str, Tensor]] | None = None

    def _round_models(
        self, module: ClusteredModule, round_index: int
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The K global models stacked [K, ...], once per round: this executor never writes the
        working copies, so they hold the round's global models for every chunk."""
        if self._stacked is None or self._stacked[0] != round_index:
            self._stacked = (round_index, *stack_models(module.models))
        return self._stacked[1], self._stacked[2]

    def run_chunk(self, module: ClusteredModule, item: dict[str, Any]) -> None:
        """E-step, local training and aggregation of the chunk's clients."""
        round_index, clients = item["round"], item["clients"].tolist()
        slots = item["slots"].tolist()
        offsets = module.data["train_offsets"]
        spans = [(int(offsets[c]), int(offsets[c + 1])) for c in clients]
        sizes = torch.tensor([stop - start for start, stop in spans])
        local_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        rows = torch.cat([torch.arange(start, stop) for start, stop in spans]).to(module.device)
        x, y = module.data["train_x"][rows], module.data["train_y"][rows]
        with module._timed("e_step"):
            params, buffers = self._round_models(module, round_index)
            losses, raw = cluster_losses(
                self.eval_template,
                params,
                buffers,
                x,
                y,
                loss_fn=self.loss_fn,
                chunk_size=module.eval_batch_size,
            )
            outputs = torch.stack([module._outputs(raw[k], y) for k in range(module.num_clusters)])
            runs, weights, proximal = self._plans(
                module, round_index, clients, slots, x, y, losses, outputs, local_offsets
            )
        with module._timed("local_training"):
            theta = self._train(module, runs, x, y, local_offsets, weights, proximal, params, buffers)
            finite = torch.stack([torch.isfinite(t.flatten(2)).all(2) for t in theta.values()]).all(0).all(1)
            if not bool(finite.all()):
                module._fail(round_index, clients[int((~finite).nonzero()[0])], "in local training")
        with module._timed("aggregation"):
            self._aggregate(module, runs, theta, params)

    def _plans(
        self,
        module: ClusteredModule,
        round_index: int,
        clients: list[int],
        slots: list[int],
        x: Tensor,
        y: Tensor,
        losses: Tensor,
        outputs: Tensor,
        local_offsets: Tensor,
    ) -> tuple[list[Any], Tensor, Tensor]:
        """Each client's rule on its share of the chunk's E-step pass (losses [N, K], outputs
        [K, N, ...]): its runs, the sample weights [N, K] of the trained copies (0 elsewhere) and
        the proximal coefficients [C, K, K]."""
        from lightning_fedcluster.module import _ClientRun, _trained_copies

        k_total, rule = module.num_clusters, module.rule
        finite = torch.isfinite(losses).all(1)
        if not bool(finite.all()):
            first_bad = int((~finite).nonzero()[0])
            client = clients[int(torch.searchsorted(local_offsets, first_bad, right=True)) - 1]
            module._fail(round_index, client, "in its E-step pass")
        weights = torch.zeros(y.shape[0], k_total, device=module.device)
        prediction = torch.zeros(len(clients), k_total, dtype=torch.float64, device=module.device)
        proximal = torch.zeros(len(clients), k_total, k_total)
        sizes = local_offsets.diff().tolist()
        contexts = [module._client_context(c, round_index, n) for c, n in zip(clients, sizes, strict=True)]
        reports = rule.e_step_many(losses, y, local_offsets, contexts, module._log_label_stats)
        runs = []
        for c, (client, slot, context, report) in enumerate(
            zip(clients, slots, contexts, reports, strict=True)
        ):
            a, b = int(local_offsets[c]), int(local_offsets[c + 1])
            plan = rule.local_plan(report, context)
            if plan.from_personal:
                raise RuntimeError(f"{type(rule).__name__} trains personal models: use the loop executor")
            sample_weights = None if plan.sample_weights is None else plan.sample_weights.to(torch.float32)
            copies = _trained_copies(plan, sample_weights)
            for s, k in enumerate(plan.clusters):
                if k in copies:
                    weights[a:b, k] = 1.0 if sample_weights is None else sample_weights[:, s]
                    for anchor, coefficient in plan.proximal[s] if plan.proximal else ():
                        proximal[c, k, anchor] += coefficient
            seed = derive_seed(module.seed, round_index, client, 0xBA7C)  # the loop's minibatch order
            order = torch.randperm(b - a, generator=torch.Generator().manual_seed(seed))
            runs.append(
                _ClientRun(client, slot, x[a:b], y[a:b], context, report, plan, sample_weights, order, copies)
            )
            prediction[c] = rule.prediction_weights(report.omega)
        module._add_train_metrics(
            outputs, y, prediction.repeat_interleave(local_offsets.diff().to(module.device), 0)
        )
        return runs, weights, proximal

    def _train(
        self,
        module: ClusteredModule,
        runs: list[Any],
        x: Tensor,
        y: Tensor,
        local_offsets: Tensor,
        weights: Tensor,
        proximal: Tensor,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
    ) -> dict[str, Tensor]:
        """Every (client, trained copy) pair's local SGD steps; returns θ [C, K, ...]."""
        datamodule = module.trainer.datamodule
        clients = [run.client for run in runs]
        steps = module.trainer.strategy.round_schedule(datamodule).steps_per_client[clients]
        trained = torch.tensor([[k in run.trained for k in range(module.num_clusters)] for run in runs])
        batches = engine_batches(
            x, y, weights, local_offsets, [run.order for run in runs], steps, datamodule.batch_size, trained
        )
        uses_proximal = bool(proximal.any())
        return local_sgd(
            self.template,
            expand_clients(params, len(runs)),
            buffers,
            batches,
            self.config,
            loss_fn=self.loss_fn,
            proximal=proximal.to(module.device) if uses_proximal else None,
            anchors=params if uses_proximal else None,
        )

    def _aggregate(
        self, module: ClusteredModule, runs: list[Any], theta: dict[str, Tensor], params: dict[str, Tensor]
    ) -> None:
        """Σ_c Σ_(source→target) w · (θ_c,source − θ_target) into the round's float64 delta sums."""
        k_total = module.num_clusters
        mix = torch.zeros(len(runs), k_total, k_total, dtype=torch.float64)
        totals = module._round_report["weights"]
        for c, run in enumerate(runs):
            for contribution in module.rule.contributions(run.report, run.plan, run.context):
                if contribution.source in run.trained and contribution.weight > 0:
                    mix[c, contribution.source, contribution.target] += contribution.weight
                    totals[contribution.target] += contribution.weight
        buffer, slots = module._round_report, torch.tensor([run.slot for run in runs], device=module.device)
        buffer["omega"][slots] = torch.stack([run.report.omega for run in runs]).to(buffer["omega"])
        buffer["label_sums"][slots] = torch.stack([run.report.label_sums for run in runs]).to(
            buffer["label_sums"]
        )
        buffer["reported"][slots] = 1.0
        if module.rule.client_reported_state():
            for run in runs:
                module._record_client_state(run)
        mix = mix.to(module.device)
        for i, name in enumerate(self.names):
            update = (theta[name] - params[name].unsqueeze(0)).double()  # [C, K, ...], as the loop
            summed = torch.einsum("cst,cs...->t...", mix, update)
            for target in range(k_total):
                module._delta_sum[target][i].add_(summed[target])
