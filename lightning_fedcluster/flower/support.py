"""What a Flower node needs of the strategy (its picklable ``TrainingPlan``), which strategies run on
Flower (those whose rounds need nothing but the client contract, estimation passes and
server-side actions on the global models and the client store: FedRC and its options, FedEM,
IFCA, FedSoft, FeSEM/WeCFL, CFL, FedAvg/FedProx), and the LR schedule the server runs for the
nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.engine.copies import local_solver
from lightning_fedcluster.engine.lr_schedulers import RoundSchedulers
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.strategies.module_options import ModuleOptions
from lightning_fedcluster.strategies.module_options import clustered_module as build_clustered_module

SCHEDULED_HYPERPARAMETERS = ("lr", "momentum", "betas")


def plan_of(strategy: Any) -> TrainingPlan:
    """The strategy's ``TrainingPlan``, refused up front when Flower cannot run it."""
    check_supported(strategy)
    return strategy.plan


def clustered_module(plan: TrainingPlan, module: Any) -> Any:
    """The ClusteredModule the Lightning engine would train (``FederatedStrategy.connect``) from a
    plan's num_clusters, seed, shared_layers and logits_from; a ClusteredModule as it is (refused
    when the strategy also set shared_layers or logits_from, which are the module's:
    ``strategies/module_options.py``)."""
    options = ModuleOptions(plan.shared_layers, plan.logits_from)
    return build_clustered_module(module, plan.num_clusters, plan.seed, options, f"the {plan.name} strategy")


def unsupported_reason(strategy: Any) -> str | None:
    """Why ``strategy`` cannot run on Flower yet (None: it can)."""
    rule: Algorithm = strategy.algorithm
    local = strategy.local_training
    if local.finetune_epochs:
        return "finetune_epochs (FedRC-FT) fine-tunes at evaluation, which the Flower apps do not run"
    persists = local.optimizer_state == "persist"
    if getattr(rule.config, "reseed_threshold", None) is not None and persists:
        return (
            "reseed_threshold with optimizer_state='persist': its split restarts every client's "
            "optimizer state for the re-seeded cluster, which the nodes hold (use optimizer_state='reset')"
        )
    capabilities = rule.capabilities
    if capabilities.personal_mixing or capabilities.personal_copies != 1:
        return "it mixes the clients' personal models on the server (D-FedEM)"
    if local.optimizer_state_dtype != "float32":
        return (
            f"optimizer_state_dtype={local.optimizer_state_dtype!r}: a node keeps its store in Flower's "
            "numpy arrays, which have no bfloat16, and the half-precision store is tested on the "
            "Lightning engine only (give optimizer_state_dtype='float32')"
        )
    precision = strategy.precision_plugin.precision
    if precision != "32-true":
        return (
            f"precision_plugin with precision={precision!r}: the nodes train in float32 and apply no "
            "autocast (mixed precision is a Lightning Trainer option; drop the precision plugin)"
        )
    if local.optimizer_state_dir is not None:
        return (
            "optimizer_state_dir: a node keeps its optimizer-state store in Flower's context between "
            "rounds, not in a file (drop optimizer_state_dir)"
        )
    return None


def flower_optimizer(models: Sequence[nn.Module]) -> torch.optim.Optimizer:
    """A node's local solver: the optimizer alone. Its schedulers, if any, run on the server,
    which sends each round's hyperparameters (``round_hyperparameters``)."""
    return local_solver(models)[0]


def server_schedulers(
    models: Sequence[nn.Module], task: Task
) -> tuple[torch.optim.Optimizer, RoundSchedulers]:
    """The server's copy of the local solver and its LR schedulers, checked before any round as
    the Lightning engine checks them (interval, frequency, a plateau scheduler's monitor)."""
    optimizer, entries = local_solver(models)
    schedulers = RoundSchedulers()
    schedulers.configure(optimizer, entries, task)
    return optimizer, schedulers


def round_hyperparameters(optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """Per parameter group, the hyperparameters a schedule may change (``lr``; ``momentum`` and
    ``betas``, which e.g. OneCycleLR cycles), as float64 tensors [G] or [G, 2]."""
    groups = optimizer.param_groups
    values: dict[str, Tensor] = {}
    for key in SCHEDULED_HYPERPARAMETERS:
        if all(key in group for group in groups):
            values[f"hyper.{key}"] = torch.tensor(
                [
                    [float(v) for v in g[key]] if isinstance(g[key], (tuple, list)) else float(g[key])
                    for g in groups
                ],
                dtype=torch.float64,
            )
    return values


def set_round_hyperparameters(optimizer: torch.optim.Optimizer, values: dict[str, Tensor]) -> None:
    """A node's solver takes the server's hyperparameters for this round (same group layout)."""
    for name, tensor in values.items():
        key = name.removeprefix("hyper.")
        if tensor.shape[0] != len(optimizer.param_groups):
            raise ValueError(
                f"the server's local solver has {tensor.shape[0]} parameter groups but this node's has "
                f"{len(optimizer.param_groups)}: run the same LightningModule on the server and the nodes"
            )
        for group, value in zip(optimizer.param_groups, tensor.tolist(), strict=True):
            if isinstance(group[key], torch.Tensor):
                group[key].fill_(value)
            else:
                group[key] = tuple(value) if isinstance(value, list) else value


def check_supported(strategy: Any) -> None:
    """Fail before any round when the strategy's algorithm needs what the Flower apps lack."""
    reason = unsupported_reason(strategy)
    if reason is not None:
        raise NotImplementedError(
            f"{type(strategy).__name__} ({type(strategy.algorithm).__name__}) is not supported on Flower "
            f"yet: {reason}. Supported: FedRCStrategy (with adam_gamma, label_noise_std, "
            "removal_threshold, reseed_threshold, server_optimizer), FedEMStrategy, IFCAStrategy, "
            "FedSoftStrategy, FeSEMStrategy, WeCFLStrategy, CFLStrategy, FedAvgStrategy, FedProxStrategy; "
            "run the others with the Lightning engine"
        )
