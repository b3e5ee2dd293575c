"""Typed work items: what the round and evaluation loaders yield to the module's steps (the
samplers carry the schedule, not data; client data stays resident as tensors)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

NO_CLIENT = -1


@dataclass
class ClientStep:
    """Local step ``step`` of ``num_steps`` of ``client`` (round slot ``slot``): the loop executor.
    ``client == NO_CLIENT`` pads a process's share so that every process runs as many items.
    ``step_count``: the client-steps this item counts in Lightning's ``global_step``: those that
    all processes run at this item's position, so that ``global_step`` is the same on every
    process and, at round ends, on any number of processes."""

    round: int
    client: int
    slot: int
    step: int
    num_steps: int
    step_count: int = 1

    @property
    def is_padding(self) -> bool:
        return self.client == NO_CLIENT


@dataclass
class ClientChunk:
    """A chunk of clients with all their local steps (the vectorised executor). ``step_count``:
    the client-steps this item counts in Lightning's ``global_step``: those of the chunks that all
    processes run at this item's position (the same on every process, and at round ends on any
    number of processes)."""

    round: int
    clients: Tensor
    slots: Tensor
    step_count: int

    @property
    def is_padding(self) -> bool:
        return self.clients.numel() == 0


@dataclass
class EvaluationChunk:
    """Consecutive participating clients scored on their test rows (``clients``), or one unseen
    client (``global_index`` >= 0). Empty ``clients`` with ``global_index`` -1 pads."""

    clients: Tensor
    global_index: int = NO_CLIENT

    @property
    def is_padding(self) -> bool:
        return self.global_index == NO_CLIENT and self.clients.numel() == 0


def empty_clients() -> Tensor:
    return torch.zeros(0, dtype=torch.long)
