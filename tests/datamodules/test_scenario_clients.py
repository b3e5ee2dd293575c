"""The clients of a scenario once its draws are made: a given partition checked client by client,
the per-client draws, and the rows read in blocks of consecutive clients (the same rows as one
read per client)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import scenario_clients
from lightning_fedcluster.datamodules.scenario_clients import check_parts, plan_clients, read_in_blocks

POOL = np.arange(2, 10)  # rows 0 and 1 are held out for the global clients


def test_a_given_partition_becomes_int64_row_ids():
    parts = check_parts([[2, 3], np.array([9], dtype=np.int32), torch.tensor([4, 5]).numpy()], POOL, 10)
    assert [p.tolist() for p in parts] == [[2, 3], [9], [4, 5]]
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([[2], []], "leaves client 1 empty"),
        ([[2], [10]], r"partition\[1\] \(client 1\) must hold integer row ids in \[0, 10\)"),
        ([[2.0]], r"partition\[0\] \(client 0\) must hold integer row ids"),
        ([[2], [1]], r"partition\[1\] \(client 1\) holds rows held out for the global test clients"),
        ([], "non-empty list with one array of row ids per client"),
        (torch.tensor([[2]]), "non-empty list"),
    ],
)
def test_a_bad_partition_is_refused_naming_the_client(parts, message):
    with pytest.raises(ValueError, match=message):
        check_parts(parts, POOL, 10)


def test_reading_in_blocks_gives_each_client_its_rows_with_fewer_reads():
    x_all, y_all = torch.arange(40.0).reshape(20, 2), torch.arange(20) * 10
    reads: list[list[int]] = []

    def read(rows: torch.Tensor):
        reads.append(rows.tolist())
        return x_all[rows], y_all[rows]

    parts = [np.array([3, 1]), np.array([7]), np.array([0, 2, 4, 6, 8]), np.array([5])]
    out = list(read_in_blocks(parts, read, block_rows=3))
    for (x, y), part in zip(out, parts, strict=True):
        assert torch.equal(x, x_all[torch.from_numpy(part)]) and torch.equal(y, y_all[torch.from_numpy(part)])
    # clients 0 and 1 together (3 rows), client 2 alone (larger than a block), client 3 alone
    assert reads == [[3, 1, 7], [0, 2, 4, 6, 8], [5]]
    reads.clear()
    assert [y.tolist() for _, y in read_in_blocks(parts, read, block_rows=100)] == [
        [30, 10], [70], [0, 20, 40, 60, 80], [50]
    ]
    assert len(reads) == 1
    assert scenario_clients.BLOCK_ROWS >= 1024  # the default reads many small clients together


def test_the_per_client_draws_cover_every_client_and_repeat_with_the_seeds():
    parts = [np.arange(10), np.arange(10, 14), np.arange(14, 34)]

    def plan(seed: int):
        return plan_clients(
            parts, np.array([0]), np.zeros(3, dtype=np.int64), np.zeros(3, dtype=bool), [torch.arange(2)],
            (1, 2), ["gaussian_noise", "contrast"], 0.25,
            np.random.default_rng(seed), np.random.default_rng(seed + 1),
        )

    first, again, other = plan(0), plan(0), plan(5)
    assert len(first.styles) == 3
    assert all(kind in {"gaussian_noise", "contrast"} for kind, _, _ in first.styles)
    assert all(1 <= severity <= 5 for _, severity, _ in first.styles)
    for (train, test), part in zip(first.splits, parts, strict=True):
        assert sorted([*train.tolist(), *test.tolist()]) == list(range(part.size))  # positions in the part
    assert [t + s for t, s in zip(first.train_sizes, first.test_sizes, strict=True)] == [10, 4, 20]
    assert first.styles == again.styles and all(
        np.array_equal(a, b) for (a, _), (b, _) in zip(first.splits, again.splits, strict=True)
    )
    assert first.styles != other.styles
