"""What every client's turn shares, without a Trainer: the local setup (working copies, rule,
task, seed, pass size, local step plan, device) and the local solver. The Lightning engine builds
one ``ClientRuntime`` per fit (``ClientRuntime.of``, when the fit starts on its device) and its
loop executor reuses it for every client; a Flower node builds its own once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.optimizer_state import StateLayout
from lightning_fedcluster.engine.outputs import LogitsFrom


@dataclass
class LocalSetup:
    """What every client's turn shares, without a Trainer: the K working copies, the rule, the
    task, the seed, the no-grad pass size, the local step plan (``batch_size`` with
    ``local_steps`` cycling, or ``local_epochs`` passes with optional ``drop_last``) and where
    the logits are in the models' output (``logits_from``)."""

    copies: ClusterCopies
    rule: Algorithm
    task: str
    seed: int
    pass_rows: int
    batch_size: int
    local_epochs: int | None
    drop_last: bool
    device: torch.device
    logits_from: LogitsFrom = None

    @property
    def models(self) -> nn.ModuleList:
        return self.copies.models


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
        """Autograd and the optimizer itself (no Lightning)."""
        return cls(optimizer, optimizer.zero_grad, lambda loss: loss.backward(), optimizer.step, layout)


@dataclass(frozen=True)
class ClientRuntime:
    """A fit's ``LocalSetup`` and ``LocalSolver``, built once."""

    setup: LocalSetup
    solver: LocalSolver

    @classmethod
    def of(cls, host: TrainingHost) -> ClientRuntime:
        """The runtime of a Lightning fit: the host's working copies on its device, the plan's
        local step plan, and Lightning's optimizer with ``manual_backward`` (so ``global_step``
        counts client-steps)."""
        plan = host.plan
        assert plan is not None
        setup = LocalSetup(
            host.copies, plan.rule, host.task, host.seed, host.pass_rows, host.batch_size,
            plan.local_epochs, plan.drop_last, host.device, host.logits_from,
        )  # fmt: skip
        optimizer = host.optimizers()
        solver = LocalSolver(
            optimizer.optimizer,
            optimizer.zero_grad,
            host.manual_backward,
            optimizer.step,
            host.optimizer_layout,
        )
        return cls(setup, solver)
