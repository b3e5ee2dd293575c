"""Cluster copies of the user's module: independent initialisation, optional shared layers, the
federated tensors of each copy, and the local solver built from the user's configure_optimizers."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.schedule import derive_seed


def independent_copies(module: nn.Module, num_clusters: int, seed: int) -> list[nn.Module]:
    """K deep copies of ``module``, each re-initialised with its own seed (reset_parameters).

    Identical starting models are a fixed point of the soft-clustering EM (every γ stays 1/K),
    so the copies must differ. The user's trainer is not copied along.
    """
    trainer = getattr(module, "_trainer", None)
    memo: dict[int, Any] = {id(trainer): None} if trainer is not None else {}
    copies, resettable = [], False
    for k in range(num_clusters):
        clone = copy.deepcopy(module, memo=dict(memo))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, k, 0xC1))
            for sub in clone.modules():
                if callable(getattr(sub, "reset_parameters", None)):
                    sub.reset_parameters()
                    resettable = True
        copies.append(clone)
    if num_clusters > 1 and not resettable:
        warnings.warn(
            f"{type(module).__name__} has no submodule with reset_parameters(): the {num_clusters} cluster "
            "models start identical, and soft clustering cannot separate identical models",
            stacklevel=3,
        )
    return copies


def state_tensors_of(model: nn.Module) -> list[Tensor]:
    """The tensors that are federated: parameters and floating-point buffers (e.g. BN statistics)."""
    return [p for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


def first_optimizer(config: Any, owner: str) -> torch.optim.Optimizer:
    """The optimizer out of any configure_optimizers return form; schedulers are ignored."""
    if isinstance(config, torch.optim.Optimizer):
        return config
    if isinstance(config, dict) and "optimizer" in config:
        if "lr_scheduler" in config:
            warnings.warn(
                f"{owner}.configure_optimizers returns an LR scheduler: it is ignored, every client's "
                "local solver starts afresh each round",
                stacklevel=4,
            )
        return config["optimizer"]
    if isinstance(config, (list, tuple)) and config:
        first = config[0]
        if isinstance(first, (list, tuple)):  # ([optimizers], [schedulers])
            first = first[0] if first else None
        return first_optimizer(first, owner)
    raise TypeError(
        f"{owner}.configure_optimizers must return an optimizer (it is the local solver of every "
        f"client), got {type(config).__name__}"
    )


def tie_shared_layers(copies: Sequence[nn.Module], shared_layers: Sequence[str]) -> list[Tensor]:
    """Make the named submodules (dotted paths, e.g. ``"features"``) of every copy the very module of
    copy 0: one shared feature extractor, K heads. Returns the shared federated tensors."""
    shared: list[Tensor] = []
    for path in shared_layers:
        try:
            module = copies[0].get_submodule(path)
        except AttributeError as error:
            raise ValueError(
                f"shared_layers names '{path}', which is not a submodule of {type(copies[0]).__name__}: "
                f"use a name from named_modules(), e.g. one of {[n for n, _ in copies[0].named_children()]}"
            ) from error
        parent_path, _, name = path.rpartition(".")
        for clone in copies[1:]:
            parent = clone.get_submodule(parent_path) if parent_path else clone
            setattr(parent, name, module)
        shared.extend(state_tensors_of(module))
    return shared
