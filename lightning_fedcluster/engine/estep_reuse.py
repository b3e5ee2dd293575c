"""``reuse_estep_forward``: the E-step pass and the first local step share one forward.

A client's turn normally forwards its N training rows through the K global models without
gradients (the E-step pass: per-sample losses [N, K] for the rule's E-step), then its first local
step forwards that step's B rows, a subset of the same rows at the same global weights, again
with gradients. With the option, the first step's B rows are forwarded once, with gradients,
before the E-step: their detached losses and outputs join those of a no-grad pass over the other
N − B rows, and the same graphs give the first step's loss once the E-step has given its sample
weights. The first step's loss and gradient are those of the plain turn for the same weights;
what changes is the rounding of the E-step's losses of those B rows (a B-row forward instead of
the pass's), hence of γ, ω and everything after, within float tolerance.

Valid where the first step trains at the weights the E-step pass reads, in the same mode: the
loop executor (the vectorised one takes every step's gradient inside one ``torch.func`` call),
a model with no layer that acts differently in training and evaluation mode (dropout,
BatchNorm's batch statistics), and a rule whose trained copy starts from the global weights
(not FedSoft's or D-FedEM's personal model). ``check_estep_reuse`` refuses the others at fit
start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.engine.client_sampling import epoch_batch
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


def check_estep_reuse(rule: Algorithm, model: nn.Module, executor: str = "loop") -> None:
    """Refuse ``reuse_estep_forward=True`` where the first local step would not train at what the
    E-step pass forwards (a ValueError naming the reason and the fix)."""
    fix = f"set {OPTION}=False"
    if executor != "loop":
        raise ValueError(
            f"{OPTION}=True runs on the loop executor only (the vectorized executor takes each step's "
            f"gradient inside one torch.func call): use executor='loop' or 'auto', or {fix}"
        )
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
    n = order.shape[0]
    if steps <= 0 or n == 0:
        return None
    if setup.local_epochs is None:
        size = min(setup.batch_size, n)
        return order[torch.arange(size, device=order.device) % n]
    _, start, stop = epoch_batch(0, n, setup.batch_size, setup.drop_last)
    return order[start:stop] if stop > start else None


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
