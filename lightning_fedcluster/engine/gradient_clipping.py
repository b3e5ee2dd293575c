"""Local gradient clipping (``gradient_clip_val``): before every local optimizer step, each trained
cluster copy's gradient is rescaled to L2 norm ``max_norm`` when it is longer. Per copy, not over
the K copies together: each copy is its own model, so a client's step on cluster k does not shrink
because its step on cluster j is long. The scale is computed in float64 and applied in the
gradient's dtype, with no host synchronisation (a scale of exactly 1 where the norm is within the
bound). The loop executor (which Flower's nodes run) and FedRC-FT's fine-tuning clip ``.grad``;
the vectorised executor clips its stacked [C, K, ...] gradients the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn


def clip_scale(norm: Tensor, max_norm: float) -> Tensor:
    """min(1, max_norm / norm), elementwise, computed in float64 and returned in ``norm``'s dtype."""
    return (max_norm / norm.double()).clamp(max=1.0).to(norm.dtype)


def copy_gradients(model: nn.Module) -> list[Tensor]:
    """The gradients of a copy's parameters that have one."""
    return [p.grad for p in model.parameters() if p.grad is not None]


def gradient_norm(grads: Sequence[Tensor]) -> Tensor:
    """The L2 norm over several tensors (the norm of their norms, as ``clip_grad_norm_``)."""
    return torch.stack([g.norm() for g in grads]).norm()


def clip_copy_gradients(models: Sequence[nn.Module], copies: Iterable[int], max_norm: float | None) -> None:
    """Rescale, in place, the gradient of each copy in ``copies`` to norm ``max_norm`` where it is
    longer (the norm over all of the copy's parameters that have a gradient). None: no clipping."""
    if max_norm is None:
        return
    with torch.no_grad():
        for k in copies:
            grads = copy_gradients(models[k])
            if grads:
                scale = clip_scale(gradient_norm(grads), max_norm)
                for g in grads:
                    g.mul_(scale)


def clip_pair_gradients(grads: Mapping[str, Tensor], max_norm: float) -> dict[str, Tensor]:
    """The vectorised executor's clipping: ``grads`` maps each parameter name to the stacked
    [C, K, ...] gradients of every (client, copy) pair; each pair's gradient (over all names) is
    rescaled to norm ``max_norm`` where it is longer."""
    norms = torch.stack([g.reshape(*g.shape[:2], -1).norm(dim=2) for g in grads.values()]).norm(dim=0)
    scale = clip_scale(norms, max_norm)
    return {name: g * scale.view(scale.shape + (1,) * (g.dim() - 2)) for name, g in grads.items()}


def check_gradient_clip_val(value: object) -> float | None:
    """``gradient_clip_val`` as a float, or None; anything else is refused by name."""
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 < value < float("inf"):
        raise ValueError(
            f"gradient_clip_val must be a finite number > 0 (each cluster copy's local gradient is "
            f"rescaled to this L2 norm when longer) or None (no clipping), got {value!r}"
        )
    return float(value)


def check_clip_with_shared_layers(gradient_clip_val: float | None, shared_layers: Sequence[str]) -> None:
    """Layers tied across the copies belong to every copy's norm at once: refused by name."""
    if gradient_clip_val is not None and shared_layers:
        raise ValueError(
            f"gradient_clip_val={gradient_clip_val:g} does not support shared_layers (a tied "
            "extractor's gradient would be clipped once per cluster copy): leave gradient_clip_val=None "
            "with shared_layers"
        )


def check_trainer_clipping(trainer: object) -> None:
    """``Trainer(gradient_clip_val=...)`` cannot clip the clients' local steps (the engine runs them;
    Lightning would refuse it as manual optimization): name the strategy's argument instead."""
    value = getattr(trainer, "gradient_clip_val", None)
    if value:
        raise ValueError(
            f"Trainer(gradient_clip_val={value}) cannot clip the clients' local steps, which the "
            f"federated engine runs: pass it to the strategy instead, e.g. FedRCStrategy(..., "
            f"gradient_clip_val={value}), and leave the Trainer's unset"
        )
