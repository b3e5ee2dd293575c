"""Dataloaders that carry rounds and evaluation chunks, not data: client data stays resident as
tensors and the module indexes it directly. A training epoch is one batch, one round
(``RoundBatch``); an evaluation pass is chunks of clients (``EvaluationChunk``). The samplers
subclass DistributedSampler, so Lightning keeps them as they are and does not wrap them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

NO_CLIENT = -1

__all__ = [
    "NO_CLIENT",
    "EvaluationChunk",
    "EvaluationSampler",
    "RoundBatch",
    "RoundSampler",
    "ServedData",
    "evaluation_dataloader",
    "round_dataloader",
]


@dataclass
class EvaluationChunk:
    """Consecutive participating clients scored on their validation or test rows (``clients``),
    or one unseen client (``global_index`` >= 0). Empty ``clients`` with ``global_index`` -1 pads."""

    clients: Tensor
    global_index: int = NO_CLIENT

    @property
    def is_padding(self) -> bool:
        return self.global_index == NO_CLIENT and self.clients.numel() == 0


def empty_clients() -> Tensor:
    return torch.zeros(0, dtype=torch.long)


class ServedData(Protocol):
    """What the loaders read of a `FederatedDataModule`: its trainer, the rounds its module handed
    it, and the size of each split. Structural, so that this module does not import the
    datamodule that imports it."""

    trainer: Any
    rounds: Callable[[], int] | None

    @property
    def val_sizes(self) -> Tensor: ...

    @property
    def test_sizes(self) -> Tensor: ...

    @property
    def num_global_clients(self) -> int: ...


class _WorkItems(Dataset):
    """The sampler already yields finished items (a round, an evaluation chunk); this dataset hands
    them through."""

    def __getitem__(self, item: Any) -> Any:
        return item

    def __len__(self) -> int:  # pragma: no cover - never asked: the sampler decides the length
        return 0


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


@dataclass
class RoundBatch:
    """The training batch of round ``round_index``: the module's executor trains this process's
    share of the round's clients and the round ends in the same step (``ClusteredModule``)."""

    round_index: int


class RoundSampler(DistributedSampler):
    """Yields one ``RoundBatch`` per epoch (one epoch is one round) on every process.

    The round is read when iteration starts (from ``rounds``, handed by the module), not from
    ``set_epoch``: Lightning builds the first iterator, and the iterator of a resumed epoch,
    before it calls ``set_epoch``.
    """

    def __init__(
        self, rounds: Callable[[], int], num_replicas: int | None = None, rank: int | None = None
    ) -> None:
        world, this_rank = _world()
        self.rounds = rounds
        self.num_replicas = world if num_replicas is None else num_replicas
        self.rank = this_rank if rank is None else rank
        self.epoch = 0

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[RoundBatch]:
        yield RoundBatch(self.rounds())


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
    """The training loader: one batch per epoch, the round the module handed over
    (``FederatedDataModule.serve_rounds``)."""
    rounds = getattr(datamodule, "rounds", None)
    if rounds is None:
        raise TypeError(
            f"a FederatedDataModule trains under a federated strategy, whose module hands it the rounds; "
            f"got {type(getattr(datamodule.trainer, 'lightning_module', None)).__name__}: pass e.g. "
            "Trainer(strategy=FedRCStrategy(num_clusters=3))"
        )
    return _loader(RoundSampler(rounds))


def evaluation_dataloader(datamodule: ServedData, stage: str) -> DataLoader:
    """The validation ("val") or test loader: chunks of participating clients, then the global clients."""
    module = getattr(datamodule.trainer, "lightning_module", None)
    rows = getattr(module, "eval_batch_size", 4096)
    return _loader(EvaluationSampler(datamodule, rows_per_item=rows, stage=stage))
