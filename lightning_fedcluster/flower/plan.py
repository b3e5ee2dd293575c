"""What a Flower node needs of the strategy (a picklable summary), and which strategies run on
Flower: those whose rounds need nothing but the client contract and server-side actions on the
global models and ω (FedRC and its options, FedEM, IFCA, FedAvg/FedProx)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import local_solver


@dataclass(frozen=True)
class TrainingPlan:
    """The strategy's client-side settings: the rule, K, seed, the local step plan, shared layers,
    whether each client's optimizer state persists across rounds, and where the logits are."""

    name: str
    rule: Algorithm
    num_clusters: int
    seed: int
    local_steps: int | None
    local_epochs: int | None
    drop_last: bool
    shared_layers: tuple[str, ...]
    optimizer_state: str
    logits_from: Any = None

    @classmethod
    def of(cls, strategy: Any) -> TrainingPlan:
        check_supported(strategy)
        return cls(
            type(strategy).__name__, strategy.algorithm, strategy.num_clusters, strategy.seed,
            strategy.local_steps, strategy.local_epochs, strategy.drop_last, tuple(strategy.shared_layers),
            strategy.local_optimizer_state, strategy.logits_from,
        )  # fmt: skip


def unsupported_reason(strategy: Any) -> str | None:
    """Why ``strategy`` cannot run on Flower yet (None: it can)."""
    rule: Algorithm = strategy.algorithm
    state = ClientState.initial(1, 0, strategy.num_clusters)
    if getattr(strategy, "finetune_epochs", 0):
        return "finetune_epochs (FedRC-FT) fine-tunes at evaluation, which the Flower apps do not run"
    if rule.keeps_personal_models:
        return "it keeps personal models (FedSoft, D-FedEM)"
    if rule.needs_estimation(0, None) or type(rule).needs_estimation is not Algorithm.needs_estimation:
        return "it runs estimation passes over every client (FedSoft)"
    if rule.max_clients_per_round(1) is not None:
        return "its server chooses the clients from the client store (FedSoft)"
    if rule.needs_model_distances:
        return "it reassigns clients by model distances after training (FeSEM, WeCFL)"
    if rule.round_vectors(state) is not None or not bool(rule.initial_active().all()):
        return "it splits clusters from the clients' updates (CFL)"
    return None


def flower_optimizer(models: Sequence[nn.Module]) -> torch.optim.Optimizer:
    """The local solver's optimizer for a node; LR schedulers are refused (the nodes do not step
    them yet), before any round when the server calls it on its own copies."""
    optimizer, schedulers = local_solver(models)
    if schedulers:
        raise NotImplementedError(
            f"{type(models[0]).__name__}.configure_optimizers returns an LR scheduler, which the Flower "
            "apps do not step yet: return the optimizer alone, or train with the Lightning engine"
        )
    return optimizer


def check_supported(strategy: Any) -> None:
    """Fail before any round when the strategy's algorithm needs what the Flower apps lack."""
    reason = unsupported_reason(strategy)
    if reason is not None:
        raise NotImplementedError(
            f"{type(strategy).__name__} ({type(strategy.algorithm).__name__}) is not supported on Flower "
            f"yet: {reason}. Supported: FedRCStrategy (with adam_gamma, label_noise_std, "
            "removal_threshold), FedEMStrategy, IFCAStrategy, FedAvgStrategy, FedProxStrategy; run the "
            "others with the Lightning engine"
        )
