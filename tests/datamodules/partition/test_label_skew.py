"""Pure partition functions: hold-out, IID / Dirichlet splits, client types, train/test; and the
partitioners beyond IID/Dirichlet: n-class, WeCFL cluster-wise, FedSoft mixtures, natural, unseen
clients (statistical checks with fixed seeds)."""

import numpy as np
import pytest
import torch

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


# --- partitioners beyond IID/Dirichlet: n-class, WeCFL cluster-wise, FedSoft mixtures, natural,
# unseen clients; statistical checks with fixed seeds --------------------------------------------


@pytest.fixture(scope="module")
def labels_4000() -> np.ndarray:
    """4000 labels over 10 classes, slightly unbalanced (the partitioners' set below)."""
    return np.random.default_rng(11).choice(10, size=4000, p=np.linspace(0.07, 0.13, 10))


def assert_disjoint(parts: list[np.ndarray]) -> None:
    merged = np.concatenate(parts)
    assert np.unique(merged).size == merged.size


# --- Dirichlet minimum client size (existing partitioner) ------------------------------------


def test_dirichlet_min_size_is_honoured_at_small_alpha(labels_4000: np.ndarray) -> None:
    # Unconstrained, only ~16% of the Dir(0.2) draws give every one of 20 clients >= 50 samples.
    unconstrained = [partition.dirichlet_split(labels_4000, 20, 0.2, rng(s)) for s in range(20)]
    assert sum(min(p.size for p in parts) >= 50 for parts in unconstrained) < 10
    for seed in range(3):
        parts = partition.dirichlet_split(labels_4000, 20, 0.2, rng(seed), min_size=50)
        assert min(p.size for p in parts) >= 50
        assert_exact_cover(parts, labels_4000.size)


# --- pathological n-class --------------------------------------------------------------------


@pytest.mark.parametrize(("clients", "n"), [(20, 2), (30, 3), (10, 1), (7, 4)])
def test_n_class_gives_exactly_n_classes_evenly(labels_4000: np.ndarray, clients: int, n: int) -> None:
    parts = partition.n_class_split(labels_4000, clients, n, rng(clients))
    assert len(parts) == clients
    assert_exact_cover(parts, labels_4000.size)  # clients * n >= 10: every class is used
    held = [np.unique(labels_4000[p]) for p in parts]
    assert all(h.size == n for h in held)
    usage = np.bincount(np.concatenate(held), minlength=10)
    assert usage.max() - usage.min() <= 1  # classes dealt evenly over clients
    for cls in range(10):  # a class's samples shared evenly among its holders
        shares = [int((labels_4000[p] == cls).sum()) for p in parts if cls in labels_4000[p]]
        assert max(shares) - min(shares) <= 1


def test_n_class_drops_unheld_classes_with_a_warning(labels_4000: np.ndarray) -> None:
    with pytest.warns(UserWarning, match="held by no client"):
        parts = partition.n_class_split(labels_4000, 3, 2, rng())
    assert_disjoint(parts)
    assert np.unique(labels_4000[np.concatenate(parts)]).size == 6


def test_n_class_rejects_bad_arguments(labels_4000: np.ndarray) -> None:
    with pytest.raises(ValueError, match="classes_per_client=11 exceeds the 10 classes"):
        partition.n_class_split(labels_4000, 5, 11, rng())
    with pytest.raises(ValueError, match="num_clients must be an integer >= 1"):
        partition.n_class_split(labels_4000, 0, 2, rng())
    with pytest.raises(ValueError, match="labels must hold integer class indices"):
        partition.n_class_split(labels_4000.astype(float), 5, 2, rng())


# --- WeCFL cluster-wise non-IID --------------------------------------------------------------


def tv(hist_a: np.ndarray, hist_b: np.ndarray) -> float:
    return float(0.5 * np.abs(hist_a - hist_b).sum())


def hist(labels: np.ndarray, rows: np.ndarray) -> np.ndarray:
    counts = np.bincount(labels[rows], minlength=10).astype(float)
    return counts / counts.sum()


def test_cluster_dirichlet_has_small_within_and_large_between_variance(labels_4000: np.ndarray) -> None:
    parts, cluster = partition.cluster_dirichlet_split(labels_4000, 40, 4, rng(5), alpha=(0.1, 10.0))
    assert len(parts) == 40 and np.bincount(cluster).tolist() == [10, 10, 10, 10]
    assert_exact_cover(parts, labels_4000.size)
    hists = np.stack([hist(labels_4000, p) for p in parts])
    within, between = [], []
    for i in range(40):
        for j in range(i + 1, 40):
            (within if cluster[i] == cluster[j] else between).append(tv(hists[i], hists[j]))
    assert np.mean(within) < 0.2  # Dir(10) inside a cluster: near the cluster's own mix
    assert np.mean(between) > 0.6  # Dir(0.1) between clusters: few dominant classes each
    assert np.mean(between) > 4 * np.mean(within)


def test_cluster_n_class_is_3_2(labels_4000: np.ndarray) -> None:
    parts, cluster = partition.cluster_n_class_split(labels_4000, 30, 5, rng(2))
    assert_exact_cover(parts, labels_4000.size)  # 5 clusters * 3 classes >= 10: all used
    held_by_clusters = []
    for k in range(5):
        members = [p for p, c in zip(parts, cluster, strict=True) if c == k]
        cluster_classes = np.unique(labels_4000[np.concatenate(members)])
        held_by_clusters.append(cluster_classes)
        assert cluster_classes.size == 3
        for p in members:
            mine = np.unique(labels_4000[p])
            assert mine.size == 2 and set(mine) <= set(cluster_classes)
    usage = np.bincount(np.concatenate(held_by_clusters), minlength=10)
    assert usage.max() - usage.min() <= 1


def test_cluster_splits_reject_bad_arguments(labels_4000: np.ndarray) -> None:
    with pytest.raises(ValueError, match="num_clusters=5 exceeds num_clients=4"):
        partition.cluster_dirichlet_split(labels_4000, 4, 5, rng())
    with pytest.raises(ValueError, match="alpha must be two positive numbers"):
        partition.cluster_dirichlet_split(labels_4000, 10, 2, rng(), alpha=(0.1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="classes_per_client=4 exceeds classes_per_cluster=3"):
        partition.cluster_n_class_split(labels_4000, 10, 2, rng(), classes_per_client=4)


# --- FedSoft mixtures ------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "minor"), [("10:90", 0.1), ("30:70", 0.3)])
def test_two_level_mixtures(pattern: str, minor: float) -> None:
    weights = partition.mixture_weights(pattern, 100, 2, rng())
    assert weights.shape == (100, 2) and np.allclose(weights.sum(axis=1), 1)
    assert sorted(np.round(weights[:, 0], 6).tolist()) == [minor] * 50 + [1 - minor] * 50
    assert not np.array_equal(weights[:50, 0], np.full(50, minor))  # clients shuffled


def test_linear_mixture_matches_the_paper() -> None:
    weights = partition.mixture_weights("linear", 100, 2, rng())
    assert np.allclose(weights[:, 0] * 100, np.arange(100) + 0.5)
    assert np.allclose(weights[:, 1] * 100, 99.5 - np.arange(100))


def test_random_mixture_is_uniform_spacings() -> None:
    weights = partition.mixture_weights("random", 4000, 4, rng(1))
    assert np.allclose(weights.sum(axis=1), 1) and (weights >= 0).all()
    # Uniform spacings of S-1 points are Dirichlet(1, ..., 1): mean 1/S, variance (S-1)/(S^2 (S+1)).
    assert np.allclose(weights.mean(axis=0), 0.25, atol=0.01)
    assert np.allclose(weights.var(axis=0), 3 / (16 * 5), atol=0.005)
    two = partition.mixture_weights("random", 4000, 2, rng(2))[:, 0]
    assert abs(two.mean() - 0.5) < 0.02 and abs(two.var() - 1 / 12) < 0.005  # Uniform(0, 1)


def test_mixture_split_draws_the_stated_counts() -> None:
    sources = np.repeat([0, 1], [3000, 3000])
    weights = partition.mixture_weights("30:70", 20, 2, rng())
    sizes = rng(1).integers(100, 201, size=20)
    parts = partition.mixture_split(sources, weights, sizes, rng(2))
    assert_disjoint(parts)
    counts = partition.mixture_counts(weights, sizes)
    for p, row, n in zip(parts, counts, sizes, strict=True):
        assert p.size == n and np.bincount(sources[p], minlength=2).tolist() == row.tolist()
    assert np.allclose(counts / sizes[:, None], weights, atol=1 / 100 + 1e-9)
    with pytest.raises(ValueError, match="source 0"):
        partition.mixture_split(sources[:300], weights, sizes, rng())


def test_mixture_weights_reject_bad_patterns() -> None:
    with pytest.raises(ValueError, match="pattern must be one of"):
        partition.mixture_weights("20:90", 10, 2, rng())
    with pytest.raises(ValueError, match="use pattern='random' for more sources"):
        partition.mixture_weights("linear", 10, 3, rng())


# --- natural partition, unseen clients, map-style datasets ------------------------------------


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


def test_dataset_labels_reads_targets_or_items() -> None:
    class Items(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            return torch.zeros(2), torch.tensor(2 - i)

    assert partition.dataset_labels(Items()).tolist() == [2, 1, 0]
    tensors = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.tensor([1, 0, 1, 3]))
    assert partition.dataset_labels(tensors).tolist() == [1, 0, 1, 3]

    class WithTargets(Items):
        targets = [5, 6, 7]

    assert partition.dataset_labels(WithTargets()).tolist() == [5, 6, 7]
    parts = partition.dirichlet_split(partition.dataset_labels(tensors), 2, 1.0, rng())
    assert_exact_cover(parts, 4)


def test_dirichlet_reserve_guarantees_min_size_under_extreme_skew() -> None:
    labels = np.random.default_rng(0).integers(0, 2, size=6000)  # binary, like Electricity
    with pytest.raises(ValueError, match="larger dirichlet_alpha"):
        partition.dirichlet_split(labels, 300, 0.1, rng(), min_size=2, max_attempts=5)
    parts = partition.dirichlet_split(labels, 300, 0.1, rng(), min_size=2, reserve=True)
    assert_exact_cover(parts, labels.size)
    assert min(p.size for p in parts) >= 2
    shares = np.array([labels[p].mean() for p in parts if p.size >= 20])
    assert np.mean((shares < 0.1) | (shares > 0.9)) > 0.5  # still strongly skewed
    again = partition.dirichlet_split(labels, 300, 0.1, rng(), min_size=2, reserve=True)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
