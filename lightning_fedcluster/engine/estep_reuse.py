"""``reuse_estep_forward``: the E-step pass and the first local step share one forward.

A client's turn normally forwards its N training rows through the K global models without
gradients (the E-step pass: per-sample losses [N, K] for the rule's E-step), then its first local
step forwards that step's B rows, a subset of the same rows at the same global weights, again
with gradients. With the option, the first step's B rows are forwarded once, with gradients,
before the E-step: their detached losses and outputs join those of a no-grad pass over the other
N − B rows, and the same graphs give the first step's loss once the E-step has given its sample
weights. On the loop executor the first step's loss is the plain turn's, bit for bit, for the
same weights (``reused_pass``, ``FirstStep``); on the vectorised one the forward is that of every
(client, copy) pair of a chunk and the gradient is taken by autograd from it instead of by
``torch.func.grad`` (``chunk_reused_pass``, ``FirstChunkStep``). What changes is the rounding of
the E-step's losses of those B rows (a B-row forward instead of the pass's) and, on the
vectorised executor, of the first gradient, hence of γ, ω and everything after, within float
tolerance.

Valid where the first step trains at the weights the E-step pass reads, in the same mode: a model
with no layer that acts differently in training and evaluation mode (dropout, BatchNorm's batch
statistics), and a rule whose trained copy starts from the global weights (not FedSoft's or
D-FedEM's personal model). ``check_estep_reuse`` refuses the others at fit start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.engine.batched_steps import LossFn, Select, StepBatch, cluster_losses
from lightning_fedcluster.engine.client_sampling import step_rows
from lightning_fedcluster.engine.losses import model_outputs, per_sample_loss
from lightning_fedcluster.engine.outputs import forward_logits
from lightning_fedcluster.engine.runtime import LocalSetup

OPTION = "reuse_estep_forward"


def mode_dependent_layers(model: nn.Module) -> list[str]:
    """Submodules whose output depends on training/evaluation mode: dropout layers, batch and
    instance norms that track running statistics, attention and recurrent layers with dropout."""
    found = []
    for name, sub in model.named_modules():
        if isinstance(sub, nn.modules.dropout._DropoutNd):
            found.append(name)
        elif isinstance(sub, nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            found.append(name)
        elif isinstance(sub, (nn.MultiheadAttention, nn.RNNBase)) and float(sub.dropout) > 0:
            found.append(name)
    return found


def check_estep_reuse(rule: Algorithm, model: nn.Module) -> None:
    """Refuse ``reuse_estep_forward=True`` where the first local step would not train at what the
    E-step pass forwards (a ValueError naming the reason and the fix)."""
    fix = f"set {OPTION}=False"
    layers = mode_dependent_layers(model)
    if layers:
        raise ValueError(
            f"{OPTION}=True needs a model whose forward is the same in training and evaluation mode, "
            f"but {type(model).__name__} has {', '.join(layers)} (dropout or running statistics): the "
            f"E-step pass runs in evaluation mode and the first step in training mode; {fix}"
        )
    capabilities = rule.capabilities
    if capabilities.personal_models or capabilities.personal_mixing:
        raise ValueError(
            f"{OPTION}=True: {type(rule).__name__} starts its trained copy from the client's personal "
            f"model, not from the global weights the E-step pass forwards; {fix}"
        )


def first_step_rows(setup: LocalSetup, order: Tensor, steps: int) -> Tensor | None:
    """The rows of a turn's local step 0 (``loop.batch_index`` at step 0) from its epoch-0
    permutation ``order``; None when the turn runs no step or the step has no rows."""
    if steps <= 0 or order.shape[0] == 0:
        return None
    rows = step_rows(order, 0, setup.batch_size, setup.local_epochs is not None, setup.drop_last)
    return rows if rows.numel() else None


@dataclass
class FirstStep:
    """The first local step's forward, kept for its loss: its rows [B] of the client's data and
    each copy k's per-sample losses [B], with their graphs."""

    rows: Tensor
    losses: list[Tensor]


def reused_pass(setup: LocalSetup, x: Tensor, y: Tensor, rows: Tensor) -> tuple[Tensor, Tensor, FirstStep]:
    """The E-step pass with the first step's forward in it: per-sample losses [N, K] and outputs
    [K, N, ...] of the K working copies (detached), rows ``rows`` from one forward with gradients
    (kept as ``FirstStep``), the other rows from the no-grad pass (``LocalSetup.evaluate``)."""
    n = x.shape[0]
    xb, yb = x[rows], y[rows]
    kept, batch_losses, batch_outputs = [], [], []
    with setup.forward_context():
        for model in setup.models:
            raw = forward_logits(model, xb, setup.logits_from)
            loss = per_sample_loss(model, xb, yb, setup.task, raw, setup.logits_from)
            kept.append(loss)
            batch_losses.append(loss.detach())
            batch_outputs.append(model_outputs(raw.detach(), setup.task))
    first_losses, first_outputs = torch.stack(batch_losses, dim=1), torch.stack(batch_outputs)
    losses = first_losses.new_empty(n, first_losses.shape[1])
    outputs = first_outputs.new_empty(first_outputs.shape[0], n, *first_outputs.shape[2:])
    losses[rows], outputs[:, rows] = first_losses, first_outputs
    other = torch.ones(n, dtype=torch.bool, device=rows.device)
    other[rows] = False
    rest = other.nonzero().squeeze(1)
    if rest.numel():
        rest_losses, rest_outputs = setup.evaluate(x[rest], y[rest])
        assert rest_losses is not None
        losses[rest], outputs[:, rest] = rest_losses.to(losses.dtype), rest_outputs.to(outputs.dtype)
    return losses, outputs, FirstStep(rows, kept)


@dataclass
class FirstChunkStep:
    """The first local step's forward of a chunk's stepping clients (the vectorised executor),
    kept for its gradient: the step's inputs [m, B, ...] (padding repeats a client's first row,
    as ``engine_batches`` does), the copies it was taken at (``leaves`` [m, K, ...], requiring
    gradients) and the per-sample losses [m, K, B] with their graph."""

    x: Tensor
    leaves: dict[str, Tensor]
    losses: Tensor

    def gradients(self, batch: StepBatch) -> dict[str, Tensor]:
        """Every (client, copy) pair's gradient of the step's loss (``local_sgd``'s pair loss
        (1/B_c) Σ_j w_cjk f_cjk) for ``batch``, the step's batch with its sample weights."""
        if not torch.equal(batch.x, self.x):
            raise RuntimeError(f"{OPTION}: the kept forward is not of the first local step's rows")
        weights = batch.weights.permute(0, 2, 1).to(self.losses.dtype)  # [m, K, B]
        total = ((weights * self.losses).sum(2) / batch.divisor.to(weights).unsqueeze(1)).sum()
        names = list(self.leaves)
        grads = torch.autograd.grad(total, [self.leaves[n] for n in names])
        # Autograd gives a linear layer's weight gradient transposed: the update's elementwise
        # operations run faster on it laid out as the weights are.
        return {n: g.contiguous() for n, g in zip(names, grads, strict=True)}


@dataclass(frozen=True)
class ChunkModels:
    """What a chunk's passes call: the functional model in training and evaluation mode, the K
    stacked global parameters and buffers, the per-sample loss, the logits selector and the rows
    of one no-grad pass."""

    template: nn.Module
    eval_template: nn.Module
    params: dict[str, Tensor]
    buffers: dict[str, Tensor]
    loss_fn: LossFn
    select: Select
    pass_rows: int


def chunk_reused_pass(
    setup: LocalSetup,
    models: ChunkModels,
    x: Tensor,
    y: Tensor,
    offsets: Tensor,
    orders: list[Tensor],
    steps: Tensor,
) -> tuple[Tensor, Tensor, FirstChunkStep | None]:
    """The vectorised executor's E-step pass with the first step's forward in it: per-sample
    losses [N, K] and raw outputs [K, N, ...] of the K global models over the chunk's rows
    (client c owns rows offsets[c]:offsets[c+1], permutation ``orders[c]``, ``steps[c]`` local
    steps, by decreasing steps), the first step's rows from one forward with gradients of every
    stepping client's K copies (kept as ``FirstChunkStep``), the other rows from the no-grad pass."""
    stepping = [c for c in range(len(orders)) if int(steps[c]) > 0]
    first_rows = [first_step_rows(setup, orders[c].to(x.device), int(steps[c])) for c in stepping]
    if not stepping or any(rows is None for rows in first_rows):
        losses, raw = cluster_losses(
            models.eval_template, models.params, models.buffers, x, y,
            loss_fn=models.loss_fn, chunk_size=models.pass_rows, select=models.select,
        )  # fmt: skip
        assert losses is not None
        return losses, raw, None
    sizes = offsets.diff()
    width = (
        setup.batch_size if setup.local_epochs is not None else int(sizes.clamp(max=setup.batch_size).max())
    )
    rows = torch.zeros(len(stepping), width, dtype=torch.long, device=x.device)
    valid = torch.zeros(len(stepping), width, dtype=torch.bool, device=x.device)
    assert stepping == list(range(len(stepping))), "a chunk's clients come by decreasing steps"
    for c, local in enumerate(first_rows):
        assert local is not None
        rows[c] = int(offsets[c])
        rows[c, : local.numel()] = int(offsets[c]) + local
        valid[c, : local.numel()] = True
    leaves = {
        n: p.detach().unsqueeze(0).expand(len(stepping), *p.shape).clone().requires_grad_()
        for n, p in models.params.items()
    }

    def pair(p: dict[str, Tensor], b: dict[str, Tensor], xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        out = models.select(functional_call(models.template, (p, b), (xb,)))
        return models.loss_fn(out, yb), out

    pairs = vmap(vmap(pair, in_dims=(0, 0, None, None)), in_dims=(0, None, 0, 0))
    with torch.enable_grad():
        kept, out = pairs(leaves, models.buffers, x[rows], y[rows])  # [m, K, B], [m, K, B, ...]
    n, k_total = x.shape[0], kept.shape[1]
    losses = kept.new_empty(n, k_total)
    raw = out.new_empty(k_total, n, *out.shape[3:])
    taken = rows[valid]
    losses[taken] = kept.detach().permute(0, 2, 1)[valid]
    raw[:, taken] = out.detach().transpose(0, 1)[:, valid]
    other = torch.ones(n, dtype=torch.bool, device=x.device)
    other[taken] = False
    rest = other.nonzero().squeeze(1)
    if rest.numel():
        rest_losses, rest_raw = cluster_losses(
            models.eval_template, models.params, models.buffers, x[rest], y[rest],
            loss_fn=models.loss_fn, chunk_size=models.pass_rows, select=models.select,
        )  # fmt: skip
        assert rest_losses is not None
        losses[rest], raw[:, rest] = rest_losses.to(losses.dtype), rest_raw.to(raw.dtype)
    return losses, raw, FirstChunkStep(x[rows], leaves, kept)
