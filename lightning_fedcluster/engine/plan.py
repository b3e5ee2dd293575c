"""``TrainingPlan``: the one frozen configuration the engine reads.

A strategy builds it (``FederatedStrategy.plan``) from its setting groups when a fit starts, and
the Flower apps ship it to the nodes; nothing under ``engine/`` reads a strategy or a Trainer for
its settings. Values are validated by the groups (``strategies/round_arguments.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

import torch

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig
from lightning_fedcluster.engine.optimizer_state import STORE_DTYPES, OptimizerStateMode, StoreDtypeName
from lightning_fedcluster.engine.reply_checks import ReplyLimits

ExecutorName = Literal["auto", "loop", "vectorized"]  # engine/executors/select.py resolves "auto"
EXECUTORS: tuple[str, ...] = get_args(ExecutorName)


@dataclass(frozen=True)
class TrainingPlan:
    """What one run trains and how.

    ``name``: the algorithm as the user chose it (the strategy's name without "Strategy"; FedEM
    and FedRC share a rule class). ``rule``: the algorithm's rules (plain tensors), the one home
    of K (``num_clusters`` reads it). The local step
    plan is ``local_steps`` or ``local_epochs`` passes (``drop_last``); ``optimizer_state`` is
    "reset" or "persist", whose store holds ``optimizer_state_dtype`` ("float32", "bfloat16",
    "float16") in memory, or in a file under ``optimizer_state_dir``; ``server_lr`` and
    ``server_optimizer`` make the server step;
    ``executor``, ``clients_per_round`` and ``clients_per_chunk`` shape the simulation, and
    ``reuse_estep_forward`` lets a client's E-step pass and first local step share one forward
    (``engine/estep_reuse.py``);
    ``finetune_epochs`` is FedRC-FT's evaluation-time fine-tuning; ``gradient_clip_val`` clips
    each trained copy's gradient before every local step (``engine/gradient_clipping.py``);
    ``precision`` is the Trainer's
    ("32-true", or "bf16-mixed": the Lightning host runs every forward under Lightning's autocast,
    ``strategies/precision.py``); ``max_update_norm`` and ``min_clients_per_round`` are the server's
    checks of the clients' replies (``engine/reply_checks.py``).
    """

    name: str
    rule: Algorithm
    seed: int = 0
    local_steps: int | None = 5
    local_epochs: int | None = None
    drop_last: bool = False
    shared_layers: tuple[str, ...] = ()
    optimizer_state: OptimizerStateMode = "reset"
    optimizer_state_dtype: StoreDtypeName = "float32"
    optimizer_state_dir: str | None = None
    logits_from: Any = None
    server_lr: float = 1.0
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    executor: ExecutorName = "auto"
    clients_per_round: int | None = None
    clients_per_chunk: int | None = None
    num_threads: int | None = None
    reuse_estep_forward: bool = False
    finetune_epochs: int = 0
    gradient_clip_val: float | None = None
    precision: str = "32-true"
    max_update_norm: float | None = None
    min_clients_per_round: int = 1

    @classmethod
    def of(cls, name: str, rule: Algorithm, groups: Iterable[Any], **settings: Any) -> TrainingPlan:
        """The plan of a strategy's setting groups (frozen dataclasses whose fields are named as
        the plan's: ``strategies/round_arguments.py``) and its other ``settings``."""
        for group in groups:
            settings.update({item.name: getattr(group, item.name) for item in fields(group)})
        return cls(name=name, rule=rule, **settings)

    @property
    def num_clusters(self) -> int:
        """K, as the rule has it."""
        return self.rule.num_clusters

    @property
    def persists_optimizer_state(self) -> bool:
        return self.optimizer_state == "persist"

    @property
    def reply_limits(self) -> ReplyLimits:
        """What the server accepts of the clients' replies."""
        return ReplyLimits(self.max_update_norm, self.min_clients_per_round)

    @property
    def optimizer_store_dtype(self) -> torch.dtype:
        """The torch dtype of the persistent optimizer-state store."""
        return STORE_DTYPES[self.optimizer_state_dtype]
