"""Dataloaders that carry the round schedule, not data: client data stays resident as tensors
and the module indexes it directly. The samplers subclass DistributedSampler, so Lightning
keeps them as they are and does not wrap them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_fedcluster.engine.schedule import RoundSchedule
from lightning_fedcluster.engine.work_items import (
    NO_CLIENT,
    ClientChunk,
    ClientStep,
    EvaluationChunk,
    empty_clients,
)

__all__ = [
    "NO_CLIENT",
    "EvaluationSampler",
    "RoundSampler",
    "ServedData",
    "evaluation_dataloader",
    "round_dataloader",
]


class ServedData(Protocol):
    """What the loaders read of a `FederatedDataModule`: its trainer and the size of each split.
    Structural, so that this module does not import the datamodule that imports it."""

    trainer: Any

    @property
    def val_sizes(self) -> Tensor: ...

    @property
    def test_sizes(self) -> Tensor: ...

    @property
    def num_global_clients(self) -> int: ...


class _WorkItems(Dataset):
    """The sampler already yields finished work items; this dataset hands them through."""

    def __getitem__(self, item: Any) -> Any:
        return item

    def __len__(self) -> int:  # pragma: no cover - never asked: the sampler decides the length
        return 0


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class RoundSampler(DistributedSampler):
    """Yields one ``ClientStep`` per (client, local step) of this process's share of the round, or
    one ``ClientChunk`` per chunk of clients when the schedule has a ``chunk_size`` (the vectorised
    executor).

    The round is read when iteration starts (from ``round_source``, e.g. the trainer's current
    epoch), not from ``set_epoch``: Lightning builds the first iterator, and the iterator of a
    resumed epoch, before it calls ``set_epoch``. Every rank yields ``items_per_rank`` items;
    the rest are padding items so that no process waits on another.
    """

    def __init__(
        self,
        schedule: RoundSchedule,
        round_source: Callable[[], int] | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        world, this_rank = _world()
        self.schedule = schedule
        self.round_source = round_source
        self.num_replicas = world if num_replicas is None else num_replicas
        self.rank = this_rank if rank is None else rank
        self.epoch = 0

    def __len__(self) -> int:
        return self.schedule.items_per_rank(self.num_replicas)

    def __iter__(self) -> Iterator[ClientStep | ClientChunk]:
        round_index = self.round_source() if self.round_source is not None else self.epoch
        if self.schedule.chunk_size is not None:
            yield from self._chunk_items(round_index)
            return
        assignment = self.schedule.assignment(round_index, self.num_replicas)
        steps_per_client = self.schedule.steps_per_client
        # Items at position p hold one client-step on each process with more than p real steps.
        totals = [sum(int(steps_per_client[client]) for _, client in share) for share in assignment]
        count = 0
        for slot, client in assignment[self.rank]:
            steps = int(steps_per_client[client])
            for step in range(steps):
                yield ClientStep(round_index, client, slot, step, steps, _ranks_beyond(totals, count))
                count += 1
        for position in range(count, len(self)):
            yield ClientStep(round_index, NO_CLIENT, -1, 0, 0, _ranks_beyond(totals, position))

    def _chunk_items(self, round_index: int) -> Iterator[ClientChunk]:
        """One item per chunk of clients, padded with empty chunks. An item's ``step_count`` is
        the step total of the chunks at its position on all processes, so that every process's
        ``global_step`` advances alike and counts the client-steps run so far on any number of
        processes (1 process: the chunk's client-steps)."""
        assignment = self.schedule.chunk_assignment(round_index, self.num_replicas)
        steps = self.schedule.steps_per_client
        counts = [0] * len(self)
        for chunks in assignment:
            for position, chunk in enumerate(chunks):
                counts[position] += int(sum(int(steps[c]) for _, c in chunk))
        mine = assignment[self.rank]
        for position in range(len(self)):
            if position < len(mine):
                chunk = mine[position]
                # Client lists travel as tensors: Lightning's device transfer walks Python lists.
                clients = torch.tensor([client for _, client in chunk])
                slots = torch.tensor([slot for slot, _ in chunk])
            else:
                clients = slots = empty_clients()
            yield ClientChunk(round_index, clients, slots, counts[position])


def _ranks_beyond(totals: list[int], position: int) -> int:
    """How many processes run a real client-step at item ``position`` (``totals``: each one's steps)."""
    return sum(total > position for total in totals)


class EvaluationSampler(DistributedSampler):
    """Yields ``EvaluationChunk`` items: consecutive training clients with rows in the stage's
    split ("val" or "test"), about ``rows_per_item`` rows per item (their local accuracy), then
    one item per global test client; dealt across ranks, padded with empty items."""

    def __init__(
        self,
        datamodule: ServedData,
        num_replicas: int | None = None,
        rank: int | None = None,
        rows_per_item: int = 4096,
        stage: str = "test",
    ) -> None:
        world, this_rank = _world()
        self.num_replicas = world if num_replicas is None else num_replicas
        self.rank = this_rank if rank is None else rank
        self.epoch = 0
        self.items: list[tuple[list[int], int]] = []
        chunk: list[int] = []
        rows = 0
        sizes = datamodule.val_sizes if stage == "val" else datamodule.test_sizes
        for client, size in enumerate(sizes.tolist()):
            if size == 0:
                continue
            chunk.append(client)
            rows += size
            if rows >= rows_per_item:
                self.items.append((chunk, NO_CLIENT))
                chunk, rows = [], 0
        if chunk:
            self.items.append((chunk, NO_CLIENT))
        self.items += [([], g) for g in range(datamodule.num_global_clients)]

    def __len__(self) -> int:
        return -(-len(self.items) // self.num_replicas)

    def __iter__(self) -> Iterator[EvaluationChunk]:
        mine = self.items[self.rank :: self.num_replicas]
        for clients, index in mine:
            yield EvaluationChunk(torch.tensor(clients, dtype=torch.long), index)
        for _ in range(len(self) - len(mine)):
            yield EvaluationChunk(empty_clients())


def _loader(sampler: DistributedSampler) -> DataLoader:
    return DataLoader(_WorkItems(), sampler=sampler, batch_size=None, num_workers=0)


def round_dataloader(datamodule: ServedData) -> DataLoader:
    """The training loader: one epoch is one communication round of the strategy's schedule."""
    strategy = _federated_strategy(datamodule)
    trainer = datamodule.trainer
    return _loader(RoundSampler(strategy.round_schedule(datamodule), lambda: trainer.current_epoch))


def evaluation_dataloader(datamodule: ServedData, stage: str) -> DataLoader:
    """The validation ("val") or test loader: chunks of participating clients, then the global clients."""
    module = getattr(datamodule.trainer, "lightning_module", None)
    rows = getattr(module, "eval_batch_size", 4096)
    return _loader(EvaluationSampler(datamodule, rows_per_item=rows, stage=stage))


def _federated_strategy(datamodule: ServedData) -> Any:
    """The trainer's strategy, which must carry a round schedule (a FederatedStrategy)."""
    strategy = getattr(datamodule.trainer, "strategy", None)
    if not callable(getattr(strategy, "round_schedule", None)):
        raise TypeError(
            f"a FederatedDataModule trains under a federated strategy, got {type(strategy).__name__}: "
            "pass e.g. Trainer(strategy=FedRCStrategy(num_clusters=3))"
        )
    return strategy
