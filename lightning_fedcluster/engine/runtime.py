"""What every client's turn shares, without a Trainer: the local setup (working copies, rule,
task, seed, pass size, local step plan, device, the forward's precision context) and the local
solver. A Lightning fit builds one ``ClientRuntime`` when it starts on its device and its
executor reuses it for every client; a Flower node builds its own once per run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.engine.client import needs_loss_pass
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.losses import evaluate_models
from lightning_fedcluster.engine.optimizer_state import StateLayout
from lightning_fedcluster.engine.outputs import LogitsFrom
from lightning_fedcluster.engine.task import Task

Timer = Callable[[str], AbstractContextManager[None]]
"""``timed(phase)``: a block whose wall time counts towards an engine phase ("e_step",
"local_training", "aggregation", "evaluation": ``ClusteredModule.phase_seconds``, benchmarks)."""


def untimed(phase: str) -> AbstractContextManager[None]:
    return nullcontext()


PHASES = ("e_step", "local_training", "aggregation", "evaluation")


class PhaseClock:
    """Cumulative wall time per engine phase (``seconds``, for benchmarks' breakdowns); a CUDA
    device is synchronised around each block, so the time is the work's, not its launch's."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    @contextlib.contextmanager
    def timed(self, phase: str, device: torch.device) -> Iterator[None]:
        """Add the wall time of the block to ``seconds[phase]``."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds[phase] += time.perf_counter() - start


@dataclass
class LocalSetup:
    """What every client's turn shares, without a Trainer: the K working copies, the rule, the
    task, the seed, the no-grad pass size, the local step plan (``batch_size`` with
    ``local_steps`` cycling, or ``local_epochs`` passes with optional ``drop_last``), where
    the logits are in the models' output (``logits_from``), the rows of the label statistics
    (``num_classes``: the class count, 0 for regression) and the context every forward runs in
    (``forward_context``: Lightning's precision plugin's, e.g. bfloat16 autocast), the norm
    each trained copy's gradient is clipped to before a local step (``gradient_clip_val``), and
    whether the E-step pass and the first local step share one forward (``reuse_estep_forward``,
    ``engine/estep_reuse.py``)."""

    copies: ClusterCopies
    rule: Algorithm
    task: Task
    seed: int
    pass_rows: int
    batch_size: int
    local_epochs: int | None
    drop_last: bool
    device: torch.device
    logits_from: LogitsFrom = None
    num_classes: int = 0
    forward_context: Callable[[], AbstractContextManager[Any]] = nullcontext
    gradient_clip_val: float | None = None
    reuse_estep_forward: bool = False

    @property
    def models(self) -> nn.ModuleList:
        return self.copies.models

    @property
    def loss_pass(self) -> bool:
        """Whether a client's turn starts with the E-step pass (``client.needs_loss_pass``); without
        it the training metrics come from the local steps."""
        return needs_loss_pass(self.rule, self.models[0])

    def evaluate(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
        """Per-sample losses [N, K] (None without labels) and outputs [K, N, ...] of the K working
        copies: one no-grad pass in the forward context."""
        with self.forward_context():
            return evaluate_models(self.models, x, y, self.task, self.pass_rows, self.logits_from)


@dataclass
class LocalSolver:
    """The local solver: one optimizer over the K copies (its state is the client's), how to zero
    gradients, backpropagate and step, and the persistent-state layout (``optimizer_state="persist"``)."""

    optimizer: torch.optim.Optimizer
    zero_grad: Callable[[], Any]
    backward: Callable[[Tensor], Any]
    step: Callable[[], Any]
    layout: StateLayout | None = None

    @classmethod
    def plain(cls, optimizer: torch.optim.Optimizer, layout: StateLayout | None = None) -> LocalSolver:
        """Autograd and the optimizer itself: every host's local steps (Lightning counts a round as
        one step of its own optimizer wrapper, not the clients' steps)."""
        return cls(optimizer, optimizer.zero_grad, lambda loss: loss.backward(), optimizer.step, layout)


@dataclass(frozen=True)
class ClientRuntime:
    """A fit's ``LocalSetup`` and ``LocalSolver``, built once."""

    setup: LocalSetup
    solver: LocalSolver
