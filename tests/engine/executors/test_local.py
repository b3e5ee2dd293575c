"""engine/executors/local.py: which of a round's clients each process trains (every slot once,
the same clients and chunks on any process count, balanced steps), and the clients' rows."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedcluster.engine.executors.local import (
    LocalClients,
    Processes,
    chunk_share,
    client_share,
    round_chunks,
)

STEPS = torch.tensor([3, 7, 1, 4, 4, 9, 2, 6, 5, 8, 1, 3])  # heterogeneous local steps, 12 slots


@pytest.mark.parametrize("count", [7, 12])
def test_every_slot_is_trained_once_with_balanced_steps_on_any_process_count(count):
    steps = STEPS[:count]
    for world in (1, 2, 3, 4, 7, 10):
        shares = [client_share(steps, Processes(rank, world)) for rank in range(world)]
        assert sorted(slot for share in shares for slot in share) == list(range(count))
        for share in shares:  # round-robin over decreasing steps: at most one client more than even
            assert len(share) <= math.ceil(count / world)
            assert sum(int(steps[s]) for s in share) <= math.ceil(count / world) * int(steps.max())


def test_one_process_trains_by_decreasing_steps_and_three_deal_that_order():
    (only,) = [client_share(STEPS, Processes())]
    assert only == [5, 9, 1, 7, 8, 3, 4, 0, 11, 6, 2, 10]  # ties keep the lower slot first
    shares = [client_share(STEPS, Processes(rank, 3)) for rank in range(3)]
    assert shares == [[5, 7, 4, 6], [9, 8, 0, 2], [1, 3, 11, 10]]


def test_chunks_do_not_depend_on_the_process_count():
    """Every process count computes the same chunks, so 1 and N processes give the same weights."""
    steps = torch.tensor([3, 1, 2, 3, 1, 1, 2, 5])
    sizes = torch.tensor([30, 10, 20, 25, 5, 12, 18, 50])
    chunks = round_chunks(steps, sizes, 3)
    assert [len(chunk) for chunk in chunks] == [3, 3, 2]
    slots = [slot for chunk in chunks for slot in chunk]
    assert sorted(slots) == list(range(8))
    keys = [(-int(steps[s]), -int(sizes[s])) for s in slots]
    assert keys == sorted(keys)  # decreasing steps, then decreasing size
    for world in (1, 2, 3, 4):
        dealt = [chunk_share(steps, sizes, 3, Processes(rank, world)) for rank in range(world)]
        assert sorted(map(str, (c for share in dealt for c in share))) == sorted(map(str, chunks))
        assert max(len(share) for share in dealt) <= math.ceil(len(chunks) / world)


def test_clients_are_read_by_their_row():
    x = torch.arange(10.0).unsqueeze(1)
    y = torch.arange(10)
    clients = LocalClients(
        x, y, torch.tensor([0, 3, 3, 10]), torch.tensor([4, 7, 9]), torch.tensor([1, 1, 2])
    )
    assert clients.sizes.tolist() == [3, 0, 7]
    assert clients.split(2)[1].tolist() == list(range(3, 10))
    gx, gy, offsets = clients.gather([2, 0])
    assert gy.tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2] and offsets.tolist() == [0, 7, 10]
    assert torch.equal(gx.squeeze(1), gy.float())
