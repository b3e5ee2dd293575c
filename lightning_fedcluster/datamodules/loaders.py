"""Dataloaders that carry the round schedule, not data: client data stays resident as tensors
and the module indexes it directly. The samplers subclass DistributedSampler, so Lightning
keeps them as they are and does not wrap them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_fedcluster.algorithms.schedule import RoundSchedule

if TYPE_CHECKING:
    from lightning_fedcluster.datamodules.federated import FederatedDataModule

NO_CLIENT = -1


class _WorkItems(Dataset):
    """The sampler already yields finished work items; this dataset hands them through."""

    def __getitem__(self, item: dict[str, int]) -> dict[str, int]:
        return item

    def __len__(self) -> int:  # pragma: no cover - never asked: the sampler decides the length
        return 0


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class RoundSampler(DistributedSampler):
    """Yields one item per (client, local step) of this process's share of the round, or one per
    chunk of clients when the schedule has a ``chunk_size`` (the vectorised executor).

    The round is read when iteration starts (from ``round_source``, e.g. the trainer's current
    epoch), not from ``set_epoch``: Lightning builds the first iterator, and the iterator of a
    resumed epoch, before it calls ``set_epoch``. Every rank yields ``items_per_rank`` items;
    the rest are no-op items (``client == -1``) so that no process waits on another.
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

    def __iter__(self) -> Iterator[dict[str, Any]]:
        round_index = self.round_source() if self.round_source is not None else self.epoch
        if self.schedule.chunk_size is not None:
            yield from self._chunk_items(round_index)
            return
        mine = self.schedule.assignment(round_index, self.num_replicas)[self.rank]
        count = 0
        for slot, client in mine:
            steps = int(self.schedule.steps_per_client[client])
            for step in range(steps):
                count += 1
                yield {"round": round_index, "client": client, "slot": slot, "step": step, "num_steps": steps}
        for _ in range(len(self) - count):
            yield {"round": round_index, "client": NO_CLIENT, "slot": -1, "step": 0, "num_steps": 0}

    def _chunk_items(self, round_index: int) -> Iterator[dict[str, Any]]:
        """One item per chunk of clients (vectorised executor), padded with empty chunks."""
        mine = self.schedule.chunk_assignment(round_index, self.num_replicas)[self.rank]
        # Client lists travel as tensors: Lightning's collate and device transfer walk Python
        # lists element by element.
        for chunk in mine:
            yield {
                "round": round_index,
                "client": chunk[0][1],
                "clients": torch.tensor([client for _, client in chunk]),
                "slots": torch.tensor([slot for slot, _ in chunk]),
            }
        empty = torch.zeros(0, dtype=torch.long)
        for _ in range(len(self) - len(mine)):
            yield {"round": round_index, "client": NO_CLIENT, "clients": empty, "slots": empty}


LOCAL, GLOBAL = 0, 1


class EvaluationSampler(DistributedSampler):
    """Yields one item per evaluated client: every training client with a test split (its
    local accuracy) and every global test client; split across ranks, padded with no-ops."""

    def __init__(
        self, datamodule: FederatedDataModule, num_replicas: int | None = None, rank: int | None = None
    ) -> None:
        world, this_rank = _world()
        self.num_replicas = world if num_replicas is None else num_replicas
        self.rank = this_rank if rank is None else rank
        self.epoch = 0
        local = [(LOCAL, int(i)) for i in (datamodule.test_sizes > 0).nonzero().flatten()]
        self.items = local + [(GLOBAL, g) for g in range(datamodule.num_global_clients)]

    def __len__(self) -> int:
        return -(-len(self.items) // self.num_replicas)

    def __iter__(self) -> Iterator[dict[str, int]]:
        mine = self.items[self.rank :: self.num_replicas]
        for kind, index in mine:
            yield {"kind": kind, "index": index}
        for _ in range(len(self) - len(mine)):
            yield {"kind": LOCAL, "index": NO_CLIENT}


def _loader(sampler: DistributedSampler) -> DataLoader:
    return DataLoader(_WorkItems(), sampler=sampler, batch_size=None, num_workers=0)


def round_dataloader(datamodule: FederatedDataModule) -> DataLoader:
    """The training loader: one epoch is one communication round of the strategy's schedule."""
    strategy = _federated_strategy(datamodule)
    trainer = datamodule.trainer
    return _loader(RoundSampler(strategy.round_schedule(datamodule), lambda: trainer.current_epoch))


def evaluation_dataloader(datamodule: FederatedDataModule) -> DataLoader:
    """The validation/test loader: one item per evaluated client."""
    return _loader(EvaluationSampler(datamodule))


def _federated_strategy(datamodule: FederatedDataModule) -> Any:
    from lightning_fedcluster.strategies.federated import FederatedStrategy

    trainer = datamodule.trainer
    strategy = getattr(trainer, "strategy", None)
    if not isinstance(strategy, FederatedStrategy):
        raise TypeError(
            f"a FederatedDataModule trains under a federated strategy, got {type(strategy).__name__}: "
            "pass e.g. Trainer(strategy=FedRCStrategy(num_clusters=3))"
        )
    return strategy
