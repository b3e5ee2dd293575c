"""``ClientStore``: every client's rows end to end in one tensor (in memory or memory-mapped from
a file), the datamodule keeping views of the slots; a row of another shape is refused by client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules.client_store import ClientStore


def _rows(n: int, start: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(start, start + n * 3, dtype=torch.float32).reshape(n, 3)
    return x, torch.arange(n, dtype=torch.long) + int(start)


@pytest.mark.parametrize("mapped", [False, True])
def test_placed_rows_lie_end_to_end_and_the_kept_splits_are_views_of_the_store(tmp_path, mapped):
    store = ClientStore([2, 3], [1, 1], (3,), memory_map=tmp_path if mapped else None)
    (train0, _), (train1, test1) = (
        store.place(0, _rows(2, 0.0), _rows(1, 100.0)),
        store.place(1, _rows(3, 10.0), _rows(1, 200.0)),
    )
    expected = torch.cat([_rows(2, 0.0)[0], _rows(3, 10.0)[0]])
    assert torch.equal(store.train_x, expected)
    assert torch.equal(store.train_y, torch.cat([_rows(2, 0.0)[1], _rows(3, 10.0)[1]]))
    assert torch.equal(store.test_x, torch.cat([_rows(1, 100.0)[0], _rows(1, 200.0)[0]]))
    # the kept splits are the store's rows, not copies: a write through the store shows in them
    store.train_x[2, 0] = -1.0
    assert train1[0][0, 0] == -1.0 and train0[0].data_ptr() == store.train_x.data_ptr()
    assert test1[1].tolist() == [200]
    if mapped:  # the training inputs are the file's bytes
        on_disk = np.fromfile(tmp_path / "train_x.f32", dtype=np.float32).reshape(5, 3)
        assert np.array_equal(on_disk, store.train_x.numpy())


def test_an_earlier_file_is_started_afresh(tmp_path):
    (tmp_path / "train_x.f32").write_bytes(b"\xff" * 4 * 100)  # a larger file of an earlier build
    store = ClientStore([2], [0], (3,), memory_map=tmp_path)
    store.place(0, _rows(2, 0.0), _rows(0, 0.0))
    assert (tmp_path / "train_x.f32").stat().st_size == 2 * 3 * 4
    assert torch.equal(store.train_x, _rows(2, 0.0)[0])


def test_rows_of_another_shape_are_refused_naming_the_client_and_the_columns():
    store = ClientStore([2, 2], [0, 0], (3,), columns="the column 'image'")
    store.place(0, _rows(2, 0.0), _rows(0, 0.0))
    message = r"client 1's inputs \(the column 'image'\) have per-sample shape \(4,\)"
    with pytest.raises(ValueError, match=message):
        store.place(1, (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long)), _rows(0, 0.0))
