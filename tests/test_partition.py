"""Pure partition functions: hold-out, IID / Dirichlet splits, client types, train/test."""

import numpy as np
import pytest

from lightning_fedcluster.datamodules import partition


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """3000 labels over 10 classes, slightly unbalanced."""
    return np.random.default_rng(123).choice(10, size=3000, p=np.linspace(0.06, 0.14, 10))


def histograms(labels: np.ndarray, parts: list[np.ndarray], num_classes: int = 10) -> np.ndarray:
    counts = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
    return counts / counts.sum(axis=1, keepdims=True)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    merged = np.concatenate(parts)
    assert merged.size == n
    assert np.array_equal(np.sort(merged), np.arange(n))


# --- largest remainder -----------------------------------------------------------------------


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


# --- stratified hold-out and IID split -------------------------------------------------------


def test_stratified_split_holds_out_each_class(labels: np.ndarray) -> None:
    kept, held = partition.stratified_split(labels, 0.2, rng())
    assert_exact_cover([kept, held], labels.size)
    for cls in range(10):
        n = int((labels == cls).sum())
        assert (labels[held] == cls).sum() == partition.held_out_count(n, 0.2)
    kept0, _ = partition.stratified_split(labels, 0.0, rng())
    assert kept0.size == labels.size


def test_iid_split_is_balanced_and_near_uniform(labels: np.ndarray) -> None:
    parts = partition.iid_split(labels.size, 10, rng())
    assert_exact_cover(parts, labels.size)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    overall = np.bincount(labels, minlength=10) / labels.size
    # 300 samples per client: label shares stay within a few points of the overall mix.
    assert np.abs(histograms(labels, parts) - overall).max() < 0.08


# --- Dirichlet label skew --------------------------------------------------------------------


def skew(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean total-variation distance between client label mixes and the overall mix."""
    overall = np.bincount(labels, minlength=10) / labels.size
    return float(0.5 * np.abs(histograms(labels, parts) - overall).sum(axis=1).mean())


def test_dirichlet_split_covers_all_and_respects_min_size(labels: np.ndarray) -> None:
    parts = partition.dirichlet_split(labels, 20, 0.5, rng(), min_size=10)
    assert len(parts) == 20
    assert_exact_cover(parts, labels.size)
    assert min(p.size for p in parts) >= 10


def test_dirichlet_alpha_controls_skew(labels: np.ndarray) -> None:
    skews = {
        alpha: skew(labels, partition.dirichlet_split(labels, 20, alpha, rng(1)))
        for alpha in (0.1, 1.0, 100.0)
    }
    iid = skew(labels, partition.iid_split(labels.size, 20, rng(1)))
    assert skews[0.1] > 0.5  # a few dominant classes per client
    assert skews[0.1] > skews[1.0] + 0.15
    assert skews[1.0] > skews[100.0] + 0.1
    assert skews[100.0] < 0.1
    assert iid < 0.15 and iid < skews[1.0] / 2  # sampling noise only (150 samples per client)
    # Dominant-class share tells the same story.
    top = partition.dirichlet_split(labels, 20, 0.1, rng(1))
    flat = partition.dirichlet_split(labels, 20, 100.0, rng(1))
    assert (
        histograms(labels, top).max(axis=1).mean() > 2 * histograms(labels, flat).max(axis=1).mean()
    )


def test_dirichlet_split_is_deterministic(labels: np.ndarray) -> None:
    a = partition.dirichlet_split(labels, 15, 1.0, rng(7))
    b = partition.dirichlet_split(labels, 15, 1.0, rng(7))
    c = partition.dirichlet_split(labels, 15, 1.0, rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_split_gives_up_with_a_clear_error(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="fewer clients .* larger dirichlet_alpha"):
        partition.dirichlet_split(labels[:60], 25, 0.05, rng(), min_size=2, max_attempts=5)


# --- client types ----------------------------------------------------------------------------


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


# --- per-client train/test -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "fraction", "n_test"),
    [(50, 0.2, 10), (48, 0.2, 10), (2, 0.2, 0), (1, 0.5, 0), (3, 0.9, 2)],
)
def test_train_test_split_sizes(n: int, fraction: float, n_test: int) -> None:
    train, test = partition.train_test_split(n, fraction, rng())
    assert test.size == n_test and train.size == n - n_test
    assert_exact_cover([train, test], n)
