"""Choosing the executor before training: ``"loop"``, ``"vectorized"``, or ``"auto"``, which
picks the vectorised executor only where it is supported and measured faster: models whose
parametrised layers are all ``nn.Linear`` (``benchmarks/vectorized_executor.py``: 1.7–2.2× for
linear and MLP models, 0.5× for the FashionMNIST CNN)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_fedcluster.engine import client_vectors
from lightning_fedcluster.engine.batched_steps import (
    SGDConfig,
    engine_batches,
    expand_clients,
    functional_template,
    local_sgd,
    stack_models,
)
from lightning_fedcluster.engine.copies import local_optimizer
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.losses import functional_loss
from lightning_fedcluster.engine.outputs import logits_selector
from lightning_fedcluster.engine.plan import EXECUTORS

DEFAULT_CLIENTS_PER_CHUNK = 64
# Bound on one chunk's stacked working copies (parameters, gradients, momentum: about 4 copies).
CHUNK_MEMORY_BYTES = 512 * 2**20


def only_dense_layers(model: nn.Module) -> bool:
    """Whether every layer that holds parameters is an ``nn.Linear`` (linear models, MLPs)."""
    owners = [sub for sub in model.modules() if any(True for _ in sub.parameters(recurse=False))]
    return bool(owners) and all(isinstance(sub, nn.Linear) for sub in owners)


def vectorized_obstacle(module: TrainingHost) -> str | None:
    """Why the vectorised executor cannot run this module under its algorithm, or None."""
    rule, model = module.rule, module.models[0]
    name = type(rule).__name__
    if module.plan is not None and module.plan.precision != "32-true":
        return (
            f"precision={module.plan.precision!r}: torch.func's vmap runs the no-grad E-step pass "
            "without autocast, so the pass would be float32 where the loop executor's is bfloat16"
        )
    if module.shared_layers:
        return "shared_layers (one extractor tied across the K copies) cannot be stacked per client"
    if rule.capabilities.personal_models:
        return f"{name} trains per-client personal models"
    if rule.capabilities.model_distances:
        return f"{name} assigns clients by distances between locally trained models"
    if client_vectors.vector_kind(rule, None) is not None:
        return f"{name} needs every client's trained model on the server"
    if callable(getattr(model, "per_sample_loss", None)):
        return f"{type(model).__name__}.per_sample_loss calls the model itself, which torch.func cannot batch"
    random = [n for n, sub in model.named_modules() if isinstance(sub, nn.modules.dropout._DropoutNd)]
    if random:
        return f"random layers ({', '.join(random)}) would draw other numbers than the loop executor"
    try:
        SGDConfig.from_optimizer(local_optimizer(module.models, module.trainer))
        functional_template(model)
    except (TypeError, ValueError, NotImplementedError) as error:
        return str(error)
    return None


def _dry_run(module: TrainingHost, x: Tensor, y: Tensor) -> str | None:
    """One vectorised step on two samples: catches models that ``torch.func`` cannot run."""
    model = module.models[0]
    try:
        params, buffers = stack_models(module.models)
        device = next(model.parameters()).device  # setup runs before Lightning moves the model
        xb, yb = x[:2].to(device), y[:2].to(device)
        weights = torch.ones(xb.shape[0], module.num_clusters, device=device)
        offsets = torch.tensor([0, xb.shape[0]])
        batch = engine_batches(
            xb, yb, weights, offsets, [torch.arange(xb.shape[0])], torch.tensor([1]), xb.shape[0]
        )
        local_sgd(
            functional_template(model),
            expand_clients(params, 1),
            buffers,
            batch,
            SGDConfig(lr=0.0),
            loss_fn=functional_loss(model, module.task),
            select=logits_selector(module.logits_from),
        )
    except Exception as error:  # noqa: BLE001 - any failure means: use the loop executor
        return f"torch.func cannot run {type(model).__name__} ({type(error).__name__}: {error})"
    return None


def choose_executor(requested: str, module: TrainingHost, x: Tensor, y: Tensor) -> str:
    """Resolve ``executor`` for this module before training. ``x``, ``y``: a few training
    samples for a dry run. "vectorized" that cannot run raises a ValueError naming the reason;
    "auto" falls back to the loop (it is a choice, not a loss)."""
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


def chunk_size_for(module: TrainingHost, requested: int | None) -> int:
    """Clients per vectorised chunk: ``requested``, else the default bounded by memory."""
    if requested is not None:
        return requested
    per_client = (
        4 * module.num_clusters * sum(p.numel() * p.element_size() for p in module.models[0].parameters())
    )
    return max(1, min(DEFAULT_CLIENTS_PER_CHUNK, CHUNK_MEMORY_BYTES // max(per_client, 1)))
