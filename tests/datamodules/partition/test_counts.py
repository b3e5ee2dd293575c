"""Exact counts: largest-remainder apportionment and client types (the paper's mix and the FedRC
authors' deal)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fedcluster.datamodules import partition
from tests.datamodules.partition.test_label_skew import rng


@pytest.mark.parametrize(
    ("total", "expected"), [(20, [10, 5, 5]), (30, [15, 8, 7]), (4, [2, 1, 1]), (1, [1, 0, 0])]
)
def test_largest_remainder_paper_mix(total: int, expected: list[int]) -> None:
    counts = partition.largest_remainder([0.5, 0.25, 0.25], total)
    assert counts.tolist() == expected


def test_largest_remainder_sums_and_is_close() -> None:
    for total in range(0, 50):
        p = [0.2, 0.3, 0.1, 0.4]
        counts = partition.largest_remainder(p, total)
        assert counts.sum() == total
        assert np.all(np.abs(counts - np.array(p) * total) < 1)


def test_largest_remainder_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="proportions"):
        partition.largest_remainder([-0.5, 1.5], 3)
    with pytest.raises(ValueError, match="total"):
        partition.largest_remainder([1.0], -1)


@pytest.mark.parametrize(
    ("num_clients", "concepts", "corrupted"),
    [(20, [10, 5, 5], [4, 1, 1]), (30, [15, 8, 7], [6, 2, 1]), (300, [150, 75, 75], [60, 15, 15])],
)
def test_paper_client_types_have_exact_counts(
    num_clients: int, concepts: list[int], corrupted: list[int]
) -> None:
    for seed in range(3):
        concept, corrupt = partition.assign_client_types(
            num_clients, [0.5, 0.25, 0.25], [0.4, 0.2, 0.2], rng(seed)
        )
        assert concept.dtype == np.int64 and corrupt.dtype == bool
        assert np.bincount(concept, minlength=3).tolist() == concepts
        assert np.bincount(concept[corrupt], minlength=3).tolist() == corrupted


def test_client_types_are_shuffled_and_deterministic() -> None:
    a = partition.assign_client_types(20, [0.5, 0.25, 0.25], [0.4, 0.2, 0.2], rng(0))
    b = partition.assign_client_types(20, [0.5, 0.25, 0.25], [0.4, 0.2, 0.2], rng(0))
    c = partition.assign_client_types(20, [0.5, 0.25, 0.25], [0.4, 0.2, 0.2], rng(1))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert not np.array_equal(a[0], np.sort(a[0]))  # not in blocks


def test_concepts_do_not_depend_on_corrupt_fractions() -> None:
    concept_a, _ = partition.assign_client_types(40, [0.5, 0.25, 0.25], [0.4, 0.2, 0.2], rng(3))
    concept_b, none = partition.assign_client_types(40, [0.5, 0.25, 0.25], [0.0, 0.0, 0.0], rng(3))
    assert np.array_equal(concept_a, concept_b)
    assert not none.any()


def test_client_types_reject_mismatched_fractions() -> None:
    with pytest.raises(ValueError, match="corrupt_fractions"):
        partition.assign_client_types(10, [0.5, 0.5], [0.1], rng())


# The authors' type codes: 0 concept 0 clean, 1 concept 0 corrupted, 2 / 3 concept 1 / 2 clean,
# 4 / 5 concept 1 / 2 corrupted.
CODE = {(0, False): 0, (0, True): 1, (1, False): 2, (2, False): 3, (1, True): 4, (2, True): 5}


def type_counts(concept: np.ndarray, corrupted: np.ndarray) -> list[int]:
    codes = [CODE[(int(c), bool(k))] for c, k in zip(concept, corrupted, strict=True)]
    return np.bincount(codes, minlength=6).tolist()


@pytest.mark.parametrize(
    ("clients", "expected"),
    [
        (300, [60, 60, 60, 60, 30, 30]),  # concepts 120 / 90 / 90, corrupted 60 / 30 / 30
        (25, [6, 5, 5, 5, 2, 2]),  # int(0.2 * 25) = 5, int(0.1 * 25) = 2, the rest clean
        (4, [4, 0, 0, 0, 0, 0]),
    ],
)
def test_authors_client_types_have_exact_counts(clients: int, expected: list[int]) -> None:
    concept, corrupted = partition.authors_client_types(clients, np.random.default_rng(0))
    assert type_counts(concept, corrupted) == expected
    again = partition.authors_client_types(clients, np.random.default_rng(0))
    assert np.array_equal(concept, again[0]) and np.array_equal(corrupted, again[1])


def test_authors_client_types_shuffle_clients() -> None:
    a = partition.authors_client_types(300, np.random.default_rng(0))[0]
    b = partition.authors_client_types(300, np.random.default_rng(1))[0]
    assert not np.array_equal(a, b) and np.array_equal(np.sort(a), np.sort(b))
    with pytest.raises(ValueError, match="num_clients must be a positive integer"):
        partition.authors_client_types(0, np.random.default_rng(0))
