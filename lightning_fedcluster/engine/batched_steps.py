"""Vectorised client execution with ``torch.func``: pure tensor math, no Lightning.

The engine simulates clients one after another on K working copies. For small models the
per-client Python and kernel-launch overhead dominates, and running all (client, cluster)
pairs of a round at once is faster. This module provides the pieces:

- ``stack_models`` / ``expand_clients``: the K cluster models as one set of stacked tensors
  (leading axis K), and copies per client (leading axes [C, K]).
- ``cluster_losses``: the no-grad E-step forward of the K models over many clients' samples at
  once (the K global models are the same for every client, so the round's samples are simply
  concatenated), with ``pad_clients`` and ``batched_e_step`` to run the FedRC/FedEM E-step of
  every client together on padded [C, N_max, K] tensors with a mask for ragged client sizes.
- ``local_sgd``: the weighted local steps of every (client, cluster) pair,
  loss_{c,k} = (1/B_c) Σ_j w_{c,j,k} f(x_{c,j}, y_{c,j}; θ_{c,k}), with torch.optim.SGD's update
  rule (momentum, dampening, Nesterov, weight decay) and a fresh optimizer state per client,
  as in the engine. Ragged clients are padded (zero weight) and masked (no update once a client
  has run its steps, none for a cluster the client does not train).
- ``engine_batches``: the engine's minibatch order (batch min(B, N_c), positions wrapping
  modulo N_c through the client's permutation) for every client at once.

Models must be functional: buffers are read only (BatchNorm in training mode is refused), and
random layers need ``randomness="different"`` (their random streams differ from the loop's).
A forward that returns a dict or tuple is read through ``select`` (output -> logits).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, stack_module_state, vmap

from lightning_fedcluster.algorithms.mixture import pad_clients, soft_e_step_rows
from lightning_fedcluster.engine.gradient_clipping import clip_pair_gradients

Params = dict[str, Tensor]
LossFn = Callable[[Tensor, Tensor], Tensor]
Select = Callable[[Any], Tensor]

__all__ = [
    "SGDConfig",
    "StepBatch",
    "batched_e_step",
    "cluster_losses",
    "engine_batches",
    "epoch_engine_batches",
    "expand_clients",
    "functional_template",
    "local_sgd",
    "pad_clients",
    "stack_models",
]


def _cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(logits, y, reduction="none")


def _identity(output: Any) -> Tensor:
    return output


def functional_template(model: nn.Module) -> nn.Module:
    """A parameter-free copy of ``model`` (on the meta device) to call with stacked tensors.

    Refuses modules whose forward would update buffers (BatchNorm with running statistics in
    training mode): under ``vmap`` the update cannot be written back.
    """
    for sub in model.modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.training and sub.track_running_stats:
            raise NotImplementedError(
                f"{type(sub).__name__} in training mode updates its running statistics, which the "
                "vectorised executor cannot do: use the loop executor for this model"
            )
    return copy.deepcopy(model).to("meta")


def stack_models(models: Sequence[nn.Module]) -> tuple[Params, Params]:
    """The K models' parameters and buffers stacked on a new leading axis (detached copies)."""
    params, buffers = stack_module_state(list(models))
    return (
        {n: p.detach().clone() for n, p in params.items()},
        {n: b.detach().clone() for n, b in buffers.items()},
    )


def expand_clients(params: Params, num_clients: int) -> Params:
    """Per-client working copies: [K, ...] → [C, K, ...] (materialised, so they can be updated)."""
    return {n: p.unsqueeze(0).expand(num_clients, *p.shape).clone() for n, p in params.items()}


@torch.no_grad()
def cluster_losses(
    template: nn.Module,
    params: Params,
    buffers: Params,
    x: Tensor,
    y: Tensor | None = None,
    *,
    loss_fn: LossFn = _cross_entropy,
    chunk_size: int = 4096,
    select: Select = _identity,
) -> tuple[Tensor | None, Tensor]:
    """One no-grad pass of the K stacked models over ``x`` (any number of clients' samples,
    concatenated), in chunks of ``chunk_size`` samples.

    Returns the per-sample losses [N, K] (None without labels) and the outputs [K, N, ...]
    (``select`` of the forward's output). Call it with ``template`` in eval mode for the
    engine's E-step semantics.
    """

    def forward(p: Params, b: Params, xb: Tensor) -> Tensor:
        return select(functional_call(template, (p, b), (xb,)))

    batched = vmap(forward, in_dims=(0, 0, None))
    outputs, losses = [], []
    for start in range(0, x.shape[0], chunk_size):
        out = batched(params, buffers, x[start : start + chunk_size])  # [K, n, ...]
        outputs.append(out)
        if y is not None:
            yb = y[start : start + chunk_size]
            losses.append(torch.stack([loss_fn(out[k], yb) for k in range(out.shape[0])], dim=1))
    out_all = torch.cat(outputs, dim=1)
    return (torch.cat(losses) if y is not None else None), out_all


def batched_e_step(
    losses: Tensor,
    labels: Tensor,
    mask: Tensor,
    log_omega: Tensor,
    log_label_stats: Tensor | None,
    num_classes: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The FedRC E-step (FedEM with ``log_label_stats=None``) of C clients on padded tensors.

    ``losses`` [C, N, K], ``labels`` [C, N], ``mask`` [C, N] (real samples first, as
    ``pad_clients`` lays them out), ``log_omega`` [C, K] (each client's prior),
    ``log_label_stats`` [Y, K] or None. Returns γ [C, N, K] (zero on padding), ω [C, K] and the
    label sums S [C, Y, K], computed by ``mixture.soft_e_step_rows`` on the real rows.
    """
    offsets = torch.cat([mask.new_zeros(1, dtype=torch.long), mask.sum(1).cumsum(0)]).cpu()
    gamma, omega, sums = soft_e_step_rows(
        losses[mask], labels[mask], offsets, log_omega.to(losses.dtype), log_label_stats, num_classes
    )
    padded = gamma.new_zeros(losses.shape)
    padded[mask] = gamma
    return padded, omega, sums


@dataclass(frozen=True)
class SGDConfig:
    """torch.optim.SGD's hyper-parameters (one parameter group)."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer) -> SGDConfig:
        """Read the configuration of a plain SGD optimizer (all groups must agree)."""
        if type(optimizer) is not torch.optim.SGD:
            raise TypeError(f"the vectorised executor implements SGD only, got {type(optimizer).__name__}")
        keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
        settings = {tuple(group[key] for key in keys) for group in optimizer.param_groups}
        if len(settings) != 1:
            raise ValueError("the vectorised executor needs one SGD setting for all parameter groups")
        group = optimizer.param_groups[0]
        if group.get("maximize", False):
            raise ValueError("maximize=True is not supported by the vectorised executor")
        return cls(**{key: group[key] for key in keys})


@dataclass(frozen=True)
class StepBatch:
    """One local step of C clients: inputs [C, B, ...], labels [C, B], sample weights
    [C, B, K] (0 on padding), the loss divisor B_c [C], and which pairs step [C, K] (bool)."""

    x: Tensor
    y: Tensor
    weights: Tensor
    divisor: Tensor
    active: Tensor


def local_sgd(
    template: nn.Module,
    params: Params,
    buffers: Params,
    batches: Iterator[StepBatch] | Sequence[StepBatch],
    config: SGDConfig,
    *,
    loss_fn: LossFn = _cross_entropy,
    select: Select = _identity,
    randomness: str = "error",
    proximal: Tensor | None = None,
    anchors: Params | None = None,
    momentum_init: Params | None = None,
    started_init: Tensor | None = None,
    return_state: bool = False,
    gradient_clip_val: float | None = None,
    on_step: Callable[[StepBatch, Tensor], None] | None = None,
    first_grads: Params | None = None,
) -> Params | tuple[Params, Params, Tensor]:
    """Run the local SGD steps of every (client, cluster) pair; returns the final [C, K, ...]
    parameters (``params`` is not modified). ``buffers`` are the K clusters' [K, ...] buffers.

    ``momentum_init`` [C, K, ...] and ``started_init`` [C, K] (bool) continue momentum buffers
    kept from earlier rounds (``optimizer_state="persist"``); with ``return_state`` the final
    momentum buffers and started flags are returned too.

    ``select`` maps the forward's output to logits.

    ``proximal`` [C, K, J] with ``anchors`` ({name: [J, ...]}): pair (c, k) also minimises
    Σ_j (proximal[c,k,j]/2)·‖θ_ck − anchors_j‖² (FedProx), whose gradient is added exactly.

    ``gradient_clip_val``: each pair's gradient (the loss's and the proximal term's, before weight
    decay, as ``clip_grad_norm_`` before ``torch.optim.SGD``'s step) is rescaled to this norm
    where it is longer (``engine/gradient_clipping.py``).

    ``on_step(batch, logits)``: called after each step's gradients with the step's raw outputs
    [m, K, B, ...] (detached, before the update), for the training metrics. ``first_grads``: the
    first step's gradients [m, K, ...], already taken (``engine/estep_reuse.py``).
    """
    if (proximal is None) != (anchors is None):
        raise ValueError("give proximal coefficients and anchors together")

    def pair_loss(p: Params, b: Params, x: Tensor, y: Tensor, w: Tensor, divisor: Tensor) -> Tensor:
        out = select(functional_call(template, (p, b), (x,)))
        return (w * loss_fn(out, y)).sum() / divisor

    def pair_loss_and_logits(
        p: Params, b: Params, x: Tensor, y: Tensor, w: Tensor, divisor: Tensor
    ) -> tuple[Tensor, Tensor]:
        out = select(functional_call(template, (p, b), (x,)))
        return (w * loss_fn(out, y)).sum() / divisor, out.detach()

    # Inner map: the K clusters of one client (same samples, own weights column); outer: clients.
    gradient = grad(pair_loss) if on_step is None else grad(pair_loss_and_logits, has_aux=True)
    per_client = vmap(gradient, in_dims=(0, 0, None, None, 1, None), randomness=randomness)
    all_pairs = vmap(per_client, in_dims=(0, None, 0, 0, 0, 0), randomness=randomness)
    theta = {n: p.detach().clone() for n, p in params.items()}
    if momentum_init is not None and config.momentum:
        momentum = {n: momentum_init[n].to(p).clone() for n, p in theta.items()}
    else:
        momentum = {n: torch.zeros_like(p) for n, p in theta.items()} if config.momentum else {}
    started: Tensor | None = None  # [C, K]: pairs whose momentum buffer exists
    if started_init is not None and config.momentum:
        started = started_init.to(next(iter(theta.values())).device).clone()
    for index, batch in enumerate(batches):
        # A batch may cover only the first m clients (the rest have run all their steps).
        m = batch.x.shape[0]
        live = {n: p[:m] for n, p in theta.items()}
        if index == 0 and first_grads is not None:
            grads = first_grads
        else:
            grads = all_pairs(live, buffers, batch.x, batch.y, batch.weights, batch.divisor.to(batch.weights))
        if on_step is not None:
            grads, logits = grads
            on_step(batch, logits)
        if started is None:
            started = torch.zeros(
                next(iter(theta.values())).shape[:2], dtype=torch.bool, device=batch.x.device
            )
        active = batch.active
        first = active & ~started[:m]
        started[:m] |= active
        if proximal is not None and anchors is not None:
            coefficients = proximal[:m]
            grads = {
                n: d + _proximal_gradient(live[n], coefficients.to(d), anchors[n]) for n, d in grads.items()
            }
        if gradient_clip_val is not None:
            grads = clip_pair_gradients(grads, gradient_clip_val)
        for name, p in live.items():
            shape = active.shape + (1,) * (p.dim() - 2)
            step_mask, first_mask = active.view(shape), first.view(shape)
            d = grads[name]
            if config.weight_decay:
                d = d + config.weight_decay * p
            if config.momentum:
                buf = momentum[name][:m]
                update = torch.where(first_mask, d, config.momentum * buf + (1 - config.dampening) * d)
                buf.copy_(torch.where(step_mask, update, buf))
                d = d + config.momentum * update if config.nesterov else update
            p.copy_(torch.where(step_mask, p - config.lr * d, p))
    if return_state:
        if started is None:
            started = torch.zeros(next(iter(theta.values())).shape[:2], dtype=torch.bool)
        return theta, momentum, started
    return theta


def _proximal_gradient(theta: Tensor, coefficients: Tensor, anchors: Tensor) -> Tensor:
    """∇ Σ_j (c_ckj/2)‖θ_ck − a_j‖² = (Σ_j c_ckj) θ_ck − Σ_j c_ckj a_j, for θ [C, K, ...]."""
    shape = coefficients.shape[:2] + (1,) * (theta.dim() - 2)
    pulled = torch.einsum("ckj,j...->ck...", coefficients, anchors.to(theta))
    return coefficients.sum(2).view(shape) * theta - pulled


def engine_batches(
    x: Tensor,
    y: Tensor,
    weights: Tensor,
    offsets: Tensor,
    orders: Sequence[Tensor],
    steps: Tensor,
    batch_size: int,
    trained: Tensor | None = None,
) -> Iterator[StepBatch]:
    """The engine's local minibatches of C clients at once, step by step.

    ``x``/``y``/``weights`` [N, ...] hold the clients' samples concatenated (client c owns rows
    offsets[c]:offsets[c+1]; weights [N, K]); ``orders[c]`` is client c's sample permutation;
    ``steps`` [C] its number of local steps; ``trained`` [C, K] (default: clusters with positive
    total weight) which clusters it trains. Client c's step s uses positions
    (s·B_c + 0..B_c−1) mod N_c of its permutation, B_c = min(batch_size, N_c); shorter batches
    are padded with zero-weight rows. A step's batch covers clients 0..m−1 only, where m − 1 is
    the last client that still steps: give clients by decreasing step count to skip finished ones.
    """
    sizes = offsets.diff()
    count = sizes.numel()
    device = x.device
    per_batch = torch.clamp(sizes, max=batch_size)
    longest = int(per_batch.max())
    if trained is None:
        totals = torch.stack([weights[int(offsets[c]) : int(offsets[c + 1])].sum(0) for c in range(count)])
        trained = totals > 0
    local_offsets = torch.cat([torch.zeros(1, dtype=sizes.dtype), sizes.cumsum(0)])
    order_pad, _ = pad_clients(torch.cat(list(orders)).to(device), local_offsets)
    lane = torch.arange(longest, device=device).unsqueeze(0)
    per_batch_d, sizes_d = per_batch.to(device).unsqueeze(1), sizes.to(device).unsqueeze(1)
    starts = offsets[:-1].to(device).unsqueeze(1)
    valid = lane < per_batch_d  # [C, B]
    trained, steps_d, divisor = trained.to(device), steps.to(device), per_batch.to(device)
    for step in range(int(steps.max())):
        # Only the clients up to the last one still stepping (all of them when sorted by steps).
        m = int((steps > step).nonzero().max()) + 1
        positions = (step * per_batch_d[:m] + lane) % sizes_d[:m]
        rows = torch.where(valid[:m], starts[:m] + order_pad[:m].gather(1, positions), starts[:m])
        w = weights[rows] * valid[:m].unsqueeze(2).to(weights.dtype)
        active = trained[:m] & (step < steps_d[:m]).unsqueeze(1)
        yield StepBatch(x=x[rows], y=y[rows], weights=w, divisor=divisor[:m], active=active)


def epoch_engine_batches(
    x: Tensor,
    y: Tensor,
    weights: Tensor,
    offsets: Tensor,
    epoch_orders: Sequence[Sequence[Tensor]],
    steps: Tensor,
    batch_size: int,
    drop_last: bool,
    trained: Tensor,
) -> Iterator[StepBatch]:
    """``engine_batches`` for clients that pass over their data in epochs (``local_epochs``):
    client c's step s is batch s mod b_c of epoch s div b_c (b_c batches per epoch), the rows
    ``epoch_orders[c][epoch][start:start+B]`` with a partial last batch unless ``drop_last``:
    a DataLoader's epochs, reshuffled each epoch. Batches are padded with zero-weight rows and
    each client's loss divisor is its own batch size."""
    sizes = offsets.diff()
    count, device = sizes.numel(), x.device
    if drop_last:
        per_epoch = torch.div(sizes, batch_size, rounding_mode="floor")
    else:
        per_epoch = torch.div(sizes + batch_size - 1, batch_size, rounding_mode="floor")
    epochs = max(len(orders) for orders in epoch_orders)
    longest = int(sizes.max())
    order_pad = torch.zeros(count, epochs, longest, dtype=torch.long)
    for c, orders in enumerate(epoch_orders):
        for e, order in enumerate(orders):
            order_pad[c, e, : order.numel()] = order
    order_pad = order_pad.to(device)
    lane = torch.arange(batch_size, device=device).unsqueeze(0)
    sizes_d, per_epoch_d, steps_d = sizes.to(device), per_epoch.to(device), steps.to(device)
    starts, trained = offsets[:-1].to(device), trained.to(device)
    client = torch.arange(count, device=device)
    for step in range(int(steps.max())):
        m = int((steps > step).nonzero().max()) + 1
        epoch = torch.div(step, per_epoch_d[:m], rounding_mode="floor").clamp(max=epochs - 1)
        first = (step % per_epoch_d[:m]) * batch_size
        size = (sizes_d[:m] - first).clamp(max=batch_size)
        valid = lane < size.unsqueeze(1)
        positions = (first.unsqueeze(1) + lane).clamp(max=longest - 1)
        local = order_pad[client[:m].unsqueeze(1), epoch.unsqueeze(1), positions]
        rows = torch.where(valid, starts[:m].unsqueeze(1) + local, starts[:m].unsqueeze(1))
        w = weights[rows] * valid.unsqueeze(2).to(weights.dtype)
        active = trained[:m] & (step < steps_d[:m]).unsqueeze(1)
        yield StepBatch(x=x[rows], y=y[rows], weights=w, divisor=size.clamp_min(1), active=active)
