"""The user's learning-rate schedulers, stepped once per round.

``configure_optimizers`` may return any of Lightning's forms: an optimizer, ``[optimizer]``,
``([optimizer], [scheduler, ...])``, ``{"optimizer": ..., "lr_scheduler": scheduler or
{"scheduler": ..., "frequency": ..., "monitor": ..., "name": ...}, "monitor": ...}``. The
optimizer is every client's local solver; its schedulers step at each round end (one epoch is
one round), so the lr of round t is what the schedule gives at t on both executors.

- ``interval="step"`` is refused: a step here is one client's local step, and clients restart
  from the global model every round, so a per-step schedule has no meaning across clients.
- ``ReduceLROnPlateau`` needs a ``monitor`` (Lightning's rule) among the round's training metrics
  (``train/loss``, ``train/acc`` or ``train/mse``): the scheduler steps when the round is
  aggregated, before that round's validation, so a validation metric would lag a round behind.
- ``frequency=n`` steps every n rounds, as Lightning does for epochs.

The schedulers are returned to Lightning, which saves and restores their state in checkpoints;
with manual optimization Lightning does not step them, so the engine does (``step``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau

from lightning_fedcluster.engine.task import Task

SCHEDULER_KEYS = ("scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau")


@dataclass(frozen=True)
class RoundScheduler:
    """One scheduler of the local solver: stepped every ``frequency`` rounds, with the round's
    ``monitor`` metric when it is a plateau scheduler."""

    scheduler: Any
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None


def parse_optimizer_config(config: Any, owner: str) -> tuple[torch.optim.Optimizer, list[RoundScheduler]]:
    """The optimizer and its schedulers out of any configure_optimizers return form of Lightning's."""
    monitor, entries = None, []
    if isinstance(config, torch.optim.Optimizer):
        optimizers = [config]
    elif isinstance(config, Mapping):
        optimizers, monitor = [config.get("optimizer")], config.get("monitor")
        entries = [config["lr_scheduler"]] if "lr_scheduler" in config else []
    elif isinstance(config, (list, tuple)) and len(config) == 2 and isinstance(config[0], (list, tuple)):
        optimizers = list(config[0])
        entries = list(config[1]) if isinstance(config[1], (list, tuple)) else [config[1]]
    elif isinstance(config, (list, tuple)) and config and all(isinstance(c, Mapping) for c in config):
        optimizers = [c.get("optimizer") for c in config]
    elif isinstance(config, (list, tuple)):
        optimizers = list(config)
    else:
        optimizers = []
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        found = type(config).__name__ if not optimizers else f"{len(optimizers)} optimizers"
        raise TypeError(
            f"{owner}.configure_optimizers must return one optimizer (it is the local solver of every "
            f"client), optionally with LR schedulers, in one of Lightning's forms; got {found}"
        )
    optimizer = optimizers[0]
    return optimizer, [scheduler_entry(entry, monitor, optimizer, owner) for entry in entries]


def scheduler_entry(entry: Any, monitor: str | None, optimizer: Any, owner: str) -> RoundScheduler:
    """One scheduler (object or Lightning's scheduler dict), checked before training."""
    config = dict(entry) if isinstance(entry, Mapping) else {"scheduler": entry}
    where = f"{owner}.configure_optimizers"
    unknown = sorted(set(config) - set(SCHEDULER_KEYS))
    if unknown or "scheduler" not in config:
        raise ValueError(
            f"{where} returns an lr_scheduler dict with keys {sorted(config)}: it needs 'scheduler' and may "
            f"have {list(SCHEDULER_KEYS[1:])}"
        )
    scheduler, interval = config["scheduler"], config.get("interval", "epoch")
    if interval == "step":
        raise ValueError(
            f"{where} asks for interval='step', but a step here is one client's local step and every client "
            "restarts from the global model each round: the engine steps schedulers once per round (one "
            "epoch); set 'interval': 'epoch' and count the schedule in rounds"
        )
    if interval != "epoch":
        raise ValueError(f"{where}: the scheduler's interval must be 'epoch' (one round), got {interval!r}")
    frequency = config.get("frequency", 1)
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise ValueError(f"{where}: the scheduler's frequency must be a positive integer, got {frequency!r}")
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ValueError(f"{where} returns a scheduler that is not attached to the optimizer it returns")
    plateau = config.get("reduce_on_plateau", isinstance(scheduler, ReduceLROnPlateau))
    monitor = config.get("monitor", monitor)
    if plateau and monitor is None:
        raise ValueError(
            f"{where} returns a ReduceLROnPlateau without a monitor: return {{'optimizer': optimizer, "
            "'lr_scheduler': {'scheduler': scheduler, 'monitor': 'train/loss'}} (it steps at each round end "
            "with the round's training loss)"
        )
    return RoundScheduler(scheduler, frequency, monitor if plateau else None, config.get("name"))


class RoundSchedulers:
    """The local solver's schedulers for the fit: handed to Lightning by ``configure`` (so their
    state is checkpointed) and stepped by ``step`` at every round end."""

    def __init__(self) -> None:
        self.entries: list[RoundScheduler] = []

    def configure(
        self, optimizer: torch.optim.Optimizer, entries: Sequence[RoundScheduler], task: Task
    ) -> Any:
        """What ClusteredModule.configure_optimizers returns to Lightning: the optimizer, with the
        schedulers when there are any. Monitors are checked here, before training."""
        metrics = task.round_metrics  # what a ReduceLROnPlateau can monitor
        for entry in entries:
            if entry.monitor is not None and entry.monitor not in metrics:
                raise ValueError(
                    f"ReduceLROnPlateau monitors {entry.monitor!r}, but it steps at each round end (when the "
                    f"round is aggregated, before its validation), where the round's training metrics "
                    f"{list(metrics)} are known: monitor one of them"
                )
        self.entries = list(entries)
        if not self.entries:
            return optimizer
        return [optimizer], [
            {"scheduler": e.scheduler, "frequency": e.frequency, "name": e.name} for e in entries
        ]

    def step(self, round_index: int, metrics: Mapping[str, float]) -> None:
        """Step every scheduler due after round ``round_index`` (0-based), so that round t + 1
        trains with the schedule's value at t + 1."""
        for entry in self.entries:
            if (round_index + 1) % entry.frequency:
                continue
            if entry.monitor is None:
                entry.scheduler.step()
            else:
                entry.scheduler.step(metrics[entry.monitor])
