"""``TrainingHost``: what the engine's executors, evaluation and checkpoint hooks read of the
object that holds the K working copies during a Lightning fit (``ClusteredModule``).

A Protocol, so that nothing under ``engine/`` imports the Lightning glue above it (no import
cycle, not even for type hints). Trainer-free callers (a Flower node, the round driver) do not
need a host: they pass a ``LocalSetup`` and a ``LocalSolver`` to the client turn functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm, ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.client_sampling import RoundSchedule
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.optimizer_state import StateLayout
from lightning_fedcluster.engine.outputs import LogitsFrom
from lightning_fedcluster.engine.plan import TrainingPlan


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
    """The K working copies and the per-fit values the engine reads (set by the host's setup)."""

    plan: TrainingPlan | None
    models: nn.ModuleList
    copies: ClusterCopies
    client_state: ClientState | None
    rounds_trained: int
    task: str
    seed: int
    logits_from: LogitsFrom
    shared_layers: tuple[str, ...]
    pass_rows: int
    stacked_pass_rows: int
    optimizer_layout: StateLayout | None
    trainer: Any  # Lightning's Trainer: its datamodule and state

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

    @property
    def data(self) -> dict[str, Tensor]: ...

    def timed(self, phase: str) -> Iterator[None]: ...

    def split(self, name: str, index: int) -> tuple[Tensor, Tensor]: ...

    def client_context(self, client: int, round_index: int, num_samples: int) -> ClientContext: ...

    def evaluate_clusters(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]: ...

    def reduce_sum(self, tensor: Tensor) -> Tensor: ...

    def personal_copies(self) -> range: ...

    def current_label_stats(self) -> Tensor | None: ...

    def mixture_prior(self) -> Tensor: ...

    def optimizers(self) -> Any: ...
