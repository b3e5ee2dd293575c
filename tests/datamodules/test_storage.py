"""datamodules/storage.py: splits concatenated into (x, y, offsets), client views of them, and the
checks of the names an evaluation stage reads."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules.storage import check_stage_part, client_slice, concatenate, keep_slices


def test_splits_are_concatenated_with_offsets_and_an_empty_split_takes_the_shape() -> None:
    first = (torch.arange(4.0).reshape(2, 2), torch.tensor([1, 0]))
    empty = (torch.empty(0), torch.empty(0, dtype=torch.long))  # given without its per-sample shape
    last = (torch.full((3, 2), 9.0), torch.tensor([2, 2, 1]))
    x, y, offsets = concatenate("client_train", [first, empty, last], (2,))
    assert offsets.tolist() == [0, 2, 2, 5]
    assert x.tolist() == [[0.0, 1.0], [2.0, 3.0], [9.0, 9.0], [9.0, 9.0], [9.0, 9.0]]
    assert y.tolist() == [1, 0, 2, 2, 1]
    x, y, offsets = concatenate("client_train", [empty], (2,))
    assert x.shape == (0, 2) and y.shape == (0,) and offsets.tolist() == [0, 0]


def test_no_splits_give_empty_tensors_of_the_declared_shapes() -> None:
    x, y, offsets = concatenate("global_test", [], (1, 8, 8), target_shape=(3,), target_dtype=torch.float32)
    assert x.shape == (0, 1, 8, 8) and y.shape == (0, 3) and y.dtype == torch.float32
    assert offsets.tolist() == [0]


def test_a_split_of_another_shape_is_named_by_its_position() -> None:
    good, wide = (torch.zeros(2, 4), torch.zeros(2)), (torch.zeros(1, 5), torch.zeros(1))
    with pytest.raises(ValueError, match=re.escape("client_test[1] inputs have per-sample shape (5,)")):
        concatenate("client_test", [good, wide], (4,))
    with pytest.raises(ValueError, match=re.escape("client_test[0] targets have per-sample shape (2,)")):
        concatenate("client_test", [(torch.zeros(1, 4), torch.zeros(1, 2))], (4,))


def test_a_client_slice_is_a_view_of_its_rows() -> None:
    x, y, offsets = torch.arange(10.0).reshape(5, 2), torch.arange(5), torch.tensor([0, 2, 2, 5])
    cx, cy = client_slice(x, y, offsets, 2, "i", 3)
    assert cx.tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]] and cy.tolist() == [2, 3, 4]
    assert cx.data_ptr() == x[2].data_ptr()  # a view, no copy
    assert client_slice(x, y, offsets, np.int64(1), "i", 3)[0].shape == (0, 2)  # an empty client


@pytest.mark.parametrize("index", [3, -1, True, 1.0])
def test_a_bad_client_index_is_an_index_error_naming_the_argument(index) -> None:
    offsets = torch.tensor([0, 2, 2, 5])
    with pytest.raises(IndexError, match=re.escape(f"client must be an integer in [0, 3), got {index!r}")):
        client_slice(torch.zeros(5), torch.zeros(5), offsets, index, "client", 3)


def test_stage_and_part_are_checked_by_name() -> None:
    for stage in ("val", "test"):
        for part in ("local", "global_adapt", "global_score"):
            check_stage_part(stage, part)
    with pytest.raises(ValueError, match="stage must be 'val' or 'test', got 'validation'"):
        check_stage_part("validation", "local")
    with pytest.raises(
        ValueError, match="part must be 'local', 'global_adapt' or 'global_score', got 'global'"
    ):
        check_stage_part("val", "global")


def test_splits_lying_end_to_end_in_a_row_store_are_kept_as_a_view() -> None:
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    copied, _, _ = concatenate("client_train", [(x[0:5], y[0:5]), (x[5:10], y[5:10])], (2,))
    assert copied.data_ptr() != x.data_ptr()  # a caller's tensor: copied, never shared
    keep_slices(x), keep_slices(y)
    splits = [(x[0:3], y[0:3]), (x[3:3], y[3:3]), (x[3:10], y[3:10])]
    joined_x, joined_y, offsets = concatenate("client_train", splits, (2,))
    assert joined_x.data_ptr() == x.data_ptr() and joined_y.data_ptr() == y.data_ptr()  # no copy
    assert torch.equal(joined_x, x) and offsets.tolist() == [0, 3, 3, 10]
    gapped_x, _, _ = concatenate("client_train", [(x[0:3], y[0:3]), (x[4:10], y[4:10])], (2,))
    assert gapped_x.data_ptr() != x.data_ptr() and torch.equal(gapped_x, torch.cat([x[0:3], x[4:10]]))
