"""Hold-outs and natural splits: stratified hold-out, per-client train/test, natural ids, unseen
clients."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fedcluster.datamodules import partition
from tests.datamodules.partition.test_label_skew import assert_exact_cover, rng


def test_stratified_split_holds_out_each_class(labels: np.ndarray) -> None:
    kept, held = partition.stratified_split(labels, 0.2, rng())
    assert_exact_cover([kept, held], labels.size)
    for cls in range(10):
        n = int((labels == cls).sum())
        assert (labels[held] == cls).sum() == partition.held_out_count(n, 0.2)
    kept0, _ = partition.stratified_split(labels, 0.0, rng())
    assert kept0.size == labels.size


@pytest.mark.parametrize(
    ("n", "fraction", "n_test"),
    [(50, 0.2, 10), (48, 0.2, 10), (2, 0.2, 0), (1, 0.5, 0), (3, 0.9, 2)],
)
def test_train_test_split_sizes(n: int, fraction: float, n_test: int) -> None:
    train, test = partition.train_test_split(n, fraction, rng())
    assert test.size == n_test and train.size == n - n_test
    assert_exact_cover([train, test], n)


def test_natural_split_groups_by_id() -> None:
    ids = np.array(["b", "a", "b", "c", "a", "a"])
    parts = partition.natural_split(ids)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [0, 2], [3]]
    assert [p.tolist() for p in partition.natural_split([3, 1, 3])] == [[1], [0, 2]]


def test_holdout_clients_is_fedem_80_20() -> None:
    seen, unseen = partition.holdout_clients(100, 0.2, rng())
    assert seen.size == 80 and unseen.size == 20
    assert np.array_equal(np.sort(np.concatenate([seen, unseen])), np.arange(100))
    assert partition.holdout_clients(1, 0.5, rng())[1].size == 0  # one client always stays
    with pytest.raises(ValueError, match="unseen fraction must be a number in"):
        partition.holdout_clients(10, 1.0, rng())
