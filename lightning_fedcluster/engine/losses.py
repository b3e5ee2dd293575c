"""The engine's per-sample loss and the no-grad pass of the K models, written once for every
executor: the user's ``per_sample_loss(batch)`` if defined, else its ``criterion`` made
unreduced, else cross-entropy (classification) or the squared error averaged over output
dimensions (regression). The model's forward output is read through ``logits_from``
(``engine/outputs.py``)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn

from lightning_fedcluster.engine.outputs import LogitsFrom, forward_logits
from lightning_fedcluster.engine.setup_checks import input_shape_error
from lightning_fedcluster.engine.task import Task

LossFn = Callable[[Tensor, Tensor], Tensor]
# No-grad passes (E-step, evaluation) forward at most this many bytes of activations at once.
PASS_ACTIVATION_BYTES = 64 * 2**20
MIN_PASS_ROWS = 32


def unreduced_criterion(model: nn.Module) -> LossFn | None:
    """The model's ``criterion`` with ``reduction="none"`` (a copy; the user's is not changed),
    returning one value per sample; None when the model has no criterion."""
    criterion = getattr(model, "criterion", None)
    if criterion is None:
        return None
    if isinstance(getattr(criterion, "reduction", None), str) and criterion.reduction != "none":
        criterion = copy.copy(criterion)
        criterion.reduction = "none"

    def loss(out: Tensor, y: Tensor) -> Tensor:
        value = criterion(out, y)
        return value.reshape(value.shape[0], -1).mean(1) if value.dim() > 1 else value

    return loss


def functional_loss(model: nn.Module, task: Task) -> LossFn:
    """The per-sample loss as a function of (outputs, targets) (also for ``torch.func``)."""
    criterion = unreduced_criterion(model)
    if criterion is not None:
        return criterion
    return task.default_loss()


def per_sample_loss(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    task: Task,
    out: Tensor | None = None,
    logits_from: LogitsFrom = None,
) -> Tensor:
    """Loss of every sample under ``model``, shape [N]; ``out`` reuses logits already computed."""
    custom = getattr(model, "per_sample_loss", None)
    if callable(custom):
        loss = custom((x, y))
    else:
        if out is None:
            out = forward_logits(model, x, logits_from)
        loss = functional_loss(model, task)(out, y)
    if loss.shape != y.shape[:1]:
        raise ValueError(
            f"the per-sample loss of {type(model).__name__} must have shape [batch] = [{y.shape[0]}], "
            f"got {tuple(loss.shape)}: return unreduced losses"
        )
    return loss


def model_outputs(raw: Tensor, task: Task) -> Tensor:
    """Class probabilities (classification) or predictions flattened to [N, D] (regression)."""
    return task.outputs(raw)


@torch.no_grad()
def evaluate_models(
    models: Sequence[nn.Module],
    x: Tensor,
    y: Tensor | None,
    task: Task,
    batch_size: int,
    logits_from: LogitsFrom = None,
) -> tuple[Tensor | None, Tensor]:
    """One no-grad pass of every model over x in batches of ``batch_size``, in eval mode.

    Returns per-sample losses [N, K] (None without labels) and outputs [K, N, C] (class
    probabilities) or [K, N, D] (regression predictions).
    """
    losses, outputs = [], []
    for model in models:
        was_training = model.training
        model.eval()
        loss_k, out_k = [], []
        for start in range(0, x.shape[0], batch_size):
            xb = x[start : start + batch_size]
            raw = forward_logits(model, xb, logits_from)
            if y is not None:
                loss_k.append(per_sample_loss(model, xb, y[start : start + batch_size], task, raw))
            out_k.append(model_outputs(raw, task))
        model.train(was_training)
        if y is not None:
            losses.append(torch.cat(loss_k))
        outputs.append(torch.cat(out_k))
    return (torch.stack(losses, dim=1) if y is not None else None), torch.stack(outputs)


def evaluate_explained(
    models: Sequence[nn.Module],
    x: Tensor,
    y: Tensor | None,
    task: Task,
    batch_size: int,
    logits_from: LogitsFrom,
    context: AbstractContextManager[object],
) -> tuple[Tensor | None, Tensor]:
    """``evaluate_models`` inside ``context`` (the precision plugin's forward context: some passes
    run in hooks, where Lightning enters no step context), a shape mismatch of the inputs
    explained with its fix (``input_shape_error``)."""
    try:
        with context:
            return evaluate_models(models, x, y, task, batch_size, logits_from)
    except RuntimeError as error:
        explained = input_shape_error(type(models[0]).__name__, x, error)
        if explained is error:
            raise
        raise explained from error


@torch.no_grad()
def activation_bytes_per_sample(model: nn.Module, x: Tensor) -> int:
    """Bytes of every submodule's output for one sample of ``x`` (a few rows), from one forward
    with hooks: what a no-grad pass holds per row at its widest."""
    total = 0

    def count(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal total
        if isinstance(output, Tensor):
            total += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return max(1, total // max(1, x.shape[0]))


def pass_rows(model: nn.Module, x: Tensor, cap: int, copies: int = 1) -> int:
    """Rows per no-grad pass: ``cap`` (``eval_batch_size``), lowered so that one pass of ``copies``
    models at once (the vectorised executor's vmapped K) holds at most ``PASS_ACTIVATION_BYTES``
    of activations (a CNN's 4,096-row pass holds ~0.6 GB, K = 3 at once ~2.4 GB)."""
    bound = PASS_ACTIVATION_BYTES // (activation_bytes_per_sample(model, x) * copies)
    return max(1, min(cap, max(MIN_PASS_ROWS, bound)))
