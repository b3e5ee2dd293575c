"""``TrainingHost``: what the engine's executors and evaluation and the module's components read
of the object that holds the K working copies during a Lightning fit (``ClusteredModule``).

A Protocol, so that nothing under ``engine/`` imports the Lightning glue above it (no import
cycle, not even for type hints). Trainer-free callers (a Flower node, the round driver) do not
need a host: they pass a ``LocalSetup`` and a ``LocalSolver`` to the client turn functions.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm, ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.client_sampling import RoundSchedule
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.outputs import LogitsFrom
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.task import Task


class FederatedRun(Protocol):
    """What the Lightning host reads of the federated strategy that runs it: the plan, the round
    schedule, the data checks and the processes. The strategy hands itself in when the trainer
    connects the module (``FederatedStrategy.connect``) and takes it back at teardown; the module
    never pulls it from the trainer."""

    @property
    def num_clusters(self) -> int: ...

    @property
    def algorithm(self) -> Algorithm: ...

    @property
    def plan(self) -> TrainingPlan: ...

    @property
    def world_size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    def round_schedule(self, datamodule: Any) -> RoundSchedule: ...

    def check_datamodule(self, datamodule: Any) -> None: ...

    def reduce(self, tensor: Tensor, group: Any = None, reduce_op: Any = "mean") -> Tensor: ...


class TrainingHost(Protocol):
    """What the engine and the module's components (``training.py``, ``prediction.py``, the
    ``Evaluator``) read of the ClusteredModule: the K working copies, the per-fit values its setup
    sets (``task``, the pass sizes) and a few services. Exactly these members
    (``tests/engine/test_host.py`` checks that each is used and that nothing else is)."""

    models: nn.ModuleList
    copies: ClusterCopies
    plan: TrainingPlan | None
    client_state: ClientState | None
    rounds_trained: int
    task: Task
    seed: int
    logits_from: LogitsFrom
    shared_layers: tuple[str, ...]
    eval_batch_size: int
    pass_rows: int
    stacked_pass_rows: int
    trainer: Any  # Lightning's Trainer: its datamodule, state, precision plugin

    @property
    def device(self) -> torch.device: ...

    @property
    def rule(self) -> Algorithm: ...

    @property
    def num_clusters(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def finetune_epochs(self) -> int: ...

    def timed(self, phase: str) -> AbstractContextManager[None]: ...

    def current_round(self) -> int: ...

    def split(self, name: str, index: int) -> tuple[Tensor, Tensor]: ...

    def client_context(self, client: int, round_index: int, num_samples: int) -> ClientContext: ...

    def evaluate_clusters(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]: ...

    def reduce_sum(self, tensor: Tensor) -> Tensor: ...

    def current_label_stats(self) -> Tensor | None: ...

    def mixture_prior(self) -> Tensor: ...

    def optimizers(self) -> Any: ...
