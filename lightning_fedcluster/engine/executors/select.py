"""Choosing the executor before training: ``"loop"``, ``"vectorized"``, or ``"auto"``, which
picks the vectorised executor where it can run and a recorded measurement on the trainer's device
type says it is faster for this kind of model (``AUTO_RULE``), and says which and why in the log."""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_info
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


CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)

# What "auto" takes where the vectorised executor can run: (device type, model kind) -> (executor,
# the measurement it rests on). Device types without a row use the "cpu" rows; a model kind other
# than these two (BatchNorm, recurrent, attention layers...) was never measured and keeps the loop.
AUTO_RULE: dict[tuple[str, str], tuple[str, str]] = {
    ("cpu", "dense"): (
        "vectorized",
        "1.7-2.2x faster than the loop for linear and MLP models on 2 CPU cores "
        "(benchmarks/results/performance.md, vectorized_executor.py)",
    ),
    ("cpu", "convolutional"): (
        "loop",
        "the vectorized executor is 2x slower for the FashionMNIST CNN on 2 CPU cores "
        "(benchmarks/results/performance.md, vectorized_executor.py)",
    ),
    ("cuda", "dense"): (
        "vectorized",
        "0.196 s against the loop's 4.263 s per round for W2's linear model on one NVIDIA H100 GPU "
        "(benchmarks/results/performance.md)",
    ),
    ("cuda", "convolutional"): (
        "vectorized",
        "0.204 s against the loop's 0.516 s per round for W1's FashionMNIST CNN on one NVIDIA H100 GPU "
        "(benchmarks/results/performance.md)",
    ),
}


def parametrised_layers(model: nn.Module) -> list[nn.Module]:
    """The submodules that hold parameters of their own."""
    return [sub for sub in model.modules() if any(True for _ in sub.parameters(recurse=False))]


def model_kind(model: nn.Module) -> str:
    """``"dense"`` (only ``nn.Linear`` layers hold parameters), ``"convolutional"`` (only linear and
    convolution layers) or ``"other"``: the kinds of ``AUTO_RULE``."""
    owners = parametrised_layers(model)
    if owners and all(isinstance(sub, nn.Linear) for sub in owners):
        return "dense"
    if owners and all(isinstance(sub, (nn.Linear, *CONVOLUTIONS)) for sub in owners):
        return "convolutional"
    return "other"


def auto_preference(device_type: str, model: nn.Module) -> tuple[str, str]:
    """The executor that ``"auto"`` prefers for ``model`` on a device of type ``device_type``
    ("cpu", "cuda", ...) where both can run, and why (the recorded measurement)."""
    kind = model_kind(model)
    if kind == "other":
        name = type(model).__name__
        return "loop", f"no measurement of the vectorized executor for {name}'s layers on {device_type}"
    measured = device_type if (device_type, kind) in AUTO_RULE else "cpu"
    executor, evidence = AUTO_RULE[(measured, kind)]
    unmeasured = "" if measured == device_type else f" (no measurement on {device_type!r}: the CPU's)"
    return executor, f"{kind} model on {device_type}{unmeasured}: {evidence}"


def device_type_of(module: TrainingHost) -> str:
    """The type of the device the trainer will train on ("cpu", "cuda", ...): at setup the model
    has not been moved yet, so it is read from the trainer's strategy, not from the model."""
    return module.trainer.strategy.root_device.type


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


def choose_executor(
    requested: str, module: TrainingHost, x: Tensor, y: Tensor, device_type: str | None = None
) -> str:
    """Resolve ``executor`` for this module before training. ``x``, ``y``: a few training
    samples for a dry run; ``device_type``: the training device's type (default: the trainer's).
    "vectorized" that cannot run raises a ValueError naming the reason; "auto" takes the
    executor ``AUTO_RULE`` prefers on that device where it can run, the loop otherwise (it is a
    choice, not a loss), and says in one INFO line which it took and why."""
    if requested not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {requested!r}")
    if requested == "loop":
        return "loop"
    why = ""
    if requested == "auto":
        preferred, why = auto_preference(device_type or device_type_of(module), module.models[0])
        if preferred == "loop":
            rank_zero_info(f"executor='auto' chose the loop executor: {why}")
            return "loop"
    reason = vectorized_obstacle(module) or _dry_run(module, x, y)
    if reason is None:
        if requested == "auto":
            rank_zero_info(f"executor='auto' chose the vectorized executor: {why}")
        return "vectorized"
    if requested == "vectorized":
        raise ValueError(
            f"executor='vectorized' cannot run this setup: {reason}; use executor='loop' or 'auto'"
        )
    rank_zero_info(f"executor='auto' chose the loop executor: the vectorized one cannot run here: {reason}")
    return "loop"


def chunk_size_for(module: TrainingHost, requested: int | None) -> int:
    """Clients per vectorised chunk: ``requested``, else the default bounded by memory."""
    if requested is not None:
        return requested
    per_client = (
        4 * module.num_clusters * sum(p.numel() * p.element_size() for p in module.models[0].parameters())
    )
    return max(1, min(DEFAULT_CLIENTS_PER_CHUNK, CHUNK_MEMORY_BYTES // max(per_client, 1)))
