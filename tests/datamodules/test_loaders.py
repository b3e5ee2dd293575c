"""The round and evaluation loaders: samplers that deal work items (not data) across processes."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.datamodules.loaders import NO_CLIENT, EvaluationSampler, RoundSampler


def pair(n: int, label: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3), torch.full((n,), label, dtype=torch.long)


@pytest.fixture(scope="module")
def datamodule() -> FederatedDataModule:
    """Five clients with 4, 0, 6, 2 and 10 held-out rows (test rows 2, 0, 3, 1, 5), two global."""
    train = [pair(3, i % 2) for i in range(5)]
    held = [pair(n, 1) for n in (4, 0, 6, 2, 10)]
    return FederatedDataModule(train, held, [pair(4), pair(4, 1)])


def test_evaluation_items_chunk_clients_by_rows_then_one_per_global_client(datamodule) -> None:
    assert datamodule.test_sizes.tolist() == [2, 0, 3, 1, 5]
    sampler = EvaluationSampler(datamodule, num_replicas=1, rank=0, rows_per_item=4, stage="test")
    items = list(sampler)
    # Clients with rows, cut once an item holds >= 4 rows: [0, 2] (5 rows), [3, 4] (6 rows).
    assert [item.clients.tolist() for item in items] == [[0, 2], [3, 4], [], []]
    assert [item.global_index for item in items] == [NO_CLIENT, NO_CLIENT, 0, 1]
    assert len(sampler) == 4 and not any(item.is_padding for item in items)


def test_evaluation_items_are_dealt_across_processes_and_padded(datamodule) -> None:
    shares = [list(EvaluationSampler(datamodule, 3, rank, rows_per_item=4, stage="val")) for rank in range(3)]
    assert [len(share) for share in shares] == [2, 2, 2]  # 4 items over 3 processes, padded to 2 each
    real = [
        (item.clients.tolist(), item.global_index)
        for share in shares
        for item in share
        if not item.is_padding
    ]
    assert sorted(real, key=str) == sorted(
        [([0, 2], NO_CLIENT), ([3, 4], NO_CLIENT), ([], 0), ([], 1)], key=str
    )
    assert sum(item.is_padding for share in shares for item in share) == 2


def test_a_round_is_one_batch_on_every_process_read_when_iteration_starts() -> None:
    current = [5]
    for world in (1, 2, 3):
        samplers = [RoundSampler(lambda: current[0], num_replicas=world, rank=r) for r in range(world)]
        assert [len(s) for s in samplers] == [1] * world  # every process runs one batch per epoch
        assert [[b.round_index for b in s] for s in samplers] == [[5]] * world
    current[0] = 6  # the round is read from the module when the epoch's iteration starts
    assert [b.round_index for b in samplers[0]] == [6]


def test_training_without_a_federated_strategy_is_refused(datamodule) -> None:
    with pytest.raises(TypeError, match="trains under a federated strategy"):
        datamodule.train_dataloader()
