"""What the local executors (the loop and the vectorised one) share: the clients whose data they
hold (``LocalClients``: a Lightning process holds every client's, a Flower node its partition's),
this process among the fit's processes (``Processes``), which of a round's clients this process
trains (``client_share``, ``chunk_share``: a pure function of the round, so every process count
trains the same clients in the same groups) and the one estimation pass (``estimation_pass``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.engine.client import client_context
from lightning_fedcluster.engine.round import Reduce, RoundState
from lightning_fedcluster.engine.runtime import LocalSetup, Timer, untimed


@dataclass(frozen=True)
class LocalClients:
    """The clients whose training data an executor holds, by their row in its client store:
    row r's samples are ``x[offsets[r]:offsets[r + 1]]`` (on the device that trains them), its
    global client id is ``ids[r]`` (seeds and minibatch orders use it) and it runs ``steps[r]``
    local steps when it takes part. A Lightning process holds every client (row = client id); a
    Flower node the clients of its partition."""

    x: Tensor
    y: Tensor
    offsets: Tensor
    ids: Tensor
    steps: Tensor

    @property
    def sizes(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def sample_rows(self, row: int) -> tuple[int, int]:
        """Where row ``row``'s samples are in ``x`` and in the store's per-sample entries."""
        return int(self.offsets[row]), int(self.offsets[row + 1])

    def split(self, row: int) -> tuple[Tensor, Tensor]:
        start, stop = self.sample_rows(row)
        return self.x[start:stop], self.y[start:stop]

    def gather(self, rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """The samples of ``rows``, concatenated in that order, and their offsets [len(rows) + 1]."""
        spans = [self.sample_rows(r) for r in rows]
        sizes = torch.tensor([stop - start for start, stop in spans])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        index = torch.cat([torch.arange(start, stop) for start, stop in spans]).to(self.x.device)
        return self.x[index], self.y[index], offsets

    def context(
        self, setup: LocalSetup, round_state: RoundState, row: int, num_classes: int
    ) -> ClientContext:
        """What the rule may know of row ``row``'s client this round (``engine/client.py``)."""
        start, stop = self.sample_rows(row)
        return client_context(
            setup.rule, round_state.store, int(self.ids[row]), round_state.round_index,
            num_samples=stop - start, num_classes=num_classes, sample_rows=(start, stop),
            seed=setup.seed, membership=round_state.membership, device=setup.device, row=row,
        )  # fmt: skip


@dataclass(frozen=True)
class Processes:
    """This process among the fit's processes: its rank, their count, and the sum of a tensor over
    them (None: one process, nothing to sum)."""

    rank: int = 0
    world: int = 1
    reduce: Reduce | None = None


def client_share(steps: Tensor, processes: Processes) -> list[int]:
    """The slots of a round's clients (``steps`` [n]: each one's local steps) this process trains,
    in the order it trains them: the slots by decreasing step count (ties by slot) dealt
    round-robin, which balances the processes' steps."""
    order = sorted(range(len(steps)), key=lambda s: (-int(steps[s]), s))
    return order[processes.rank :: processes.world]


def round_chunks(steps: Tensor, sizes: Tensor, chunk_size: int) -> list[list[int]]:
    """A round's slots in chunks of at most ``chunk_size``: clients with similar step counts (then
    sizes) share a chunk, so little vectorised work is masked or padded away. Formed without
    regard to the process count, so every process count computes the same chunks."""
    order = sorted(range(len(steps)), key=lambda s: (-int(steps[s]), -int(sizes[s]), s))
    return [order[i : i + chunk_size] for i in range(0, len(order), chunk_size)]


def chunk_share(steps: Tensor, sizes: Tensor, chunk_size: int, processes: Processes) -> list[list[int]]:
    """The chunks of a round (``round_chunks``) this process trains: dealt round-robin."""
    return round_chunks(steps, sizes, chunk_size)[processes.rank :: processes.world]


def estimation_pass(
    setup: LocalSetup,
    clients: LocalClients,
    active: Tensor,
    processes: Processes | None = None,
    timed: Timer = untimed,
) -> Tensor:
    """Every held client's estimate [R, K] (float64, CPU): ``rule.estimate`` of its training
    losses under the K global models (FedSoft's importance) over the ``active`` clusters [K], the
    rows split across processes and summed. The one estimation pass of the Lightning engine and
    the Flower nodes."""
    processes = processes or Processes()
    rows = len(clients.ids)
    estimates = torch.zeros(rows, active.shape[0], dtype=torch.float64, device=setup.device)
    active = active.to(setup.device)
    with timed("e_step"), torch.no_grad():
        for row in range(processes.rank, rows, processes.world):
            losses, _ = setup.evaluate(*clients.split(row))
            estimates[row] = setup.rule.estimate(losses, active)
        if processes.reduce is not None:
            estimates = processes.reduce(estimates)
    return estimates.cpu()
