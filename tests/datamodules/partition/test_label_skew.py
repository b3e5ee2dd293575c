"""Label-skew partitioners: IID, Dirichlet (minimum size, reserve), n-class, WeCFL cluster-wise and
the FedRC authors' prior Dirichlet (statistical checks with fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fedcluster.datamodules import partition


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def histograms(labels: np.ndarray, parts: list[np.ndarray], num_classes: int = 10) -> np.ndarray:
    counts = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
    return counts / counts.sum(axis=1, keepdims=True)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    merged = np.concatenate(parts)
    assert merged.size == n
    assert np.array_equal(np.sort(merged), np.arange(n))


def assert_disjoint(parts: list[np.ndarray]) -> None:
    merged = np.concatenate(parts)
    assert np.unique(merged).size == merged.size


@pytest.fixture(scope="module")
def labels_4000() -> np.ndarray:
    """4000 labels over 10 classes, slightly unbalanced (the partitioners' set below)."""
    return np.random.default_rng(11).choice(10, size=4000, p=np.linspace(0.07, 0.13, 10))


def test_iid_split_is_balanced_and_near_uniform(labels: np.ndarray) -> None:
    parts = partition.iid_split(labels.size, 10, rng())
    assert_exact_cover(parts, labels.size)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    overall = np.bincount(labels, minlength=10) / labels.size
    # 300 samples per client: label shares stay within a few points of the overall mix.
    assert np.abs(histograms(labels, parts) - overall).max() < 0.08


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
    assert histograms(labels, top).max(axis=1).mean() > 2 * histograms(labels, flat).max(axis=1).mean()


def test_dirichlet_split_is_deterministic(labels: np.ndarray) -> None:
    a = partition.dirichlet_split(labels, 15, 1.0, rng(7))
    b = partition.dirichlet_split(labels, 15, 1.0, rng(7))
    c = partition.dirichlet_split(labels, 15, 1.0, rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_split_gives_up_with_a_clear_error(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="fewer clients .* larger dirichlet_alpha"):
        partition.dirichlet_split(labels[:60], 25, 0.05, rng(), min_size=2, max_attempts=5)


def test_dirichlet_min_size_is_honoured_at_small_alpha(labels_4000: np.ndarray) -> None:
    # Unconstrained, only ~16% of the Dir(0.2) draws give every one of 20 clients >= 50 samples.
    unconstrained = [partition.dirichlet_split(labels_4000, 20, 0.2, rng(s)) for s in range(20)]
    assert sum(min(p.size for p in parts) >= 50 for parts in unconstrained) < 10
    for seed in range(3):
        parts = partition.dirichlet_split(labels_4000, 20, 0.2, rng(seed), min_size=50)
        assert min(p.size for p in parts) >= 50
        assert_exact_cover(parts, labels_4000.size)


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


class RecordingGenerator:
    """A numpy Generator that records the concentration of every Dirichlet draw."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.alphas: list[np.ndarray] = []

    def dirichlet(self, alpha: np.ndarray) -> np.ndarray:
        self.alphas.append(np.array(alpha, dtype=float))
        return self.rng.dirichlet(alpha)

    def __getattr__(self, name: str):  # everything else goes to the real generator
        return getattr(self.rng, name)


def test_prior_dirichlet_draws_dir_alpha_times_the_remaining_class_prior() -> None:
    labels = np.repeat(np.arange(4), [500, 300, 150, 50])  # p = 0.5 / 0.3 / 0.15 / 0.05
    rng = RecordingGenerator(0)
    parts = partition.prior_dirichlet_split(labels, 10, 2.5, rng)  # type: ignore[arg-type]
    assert len(rng.alphas) == 10
    np.testing.assert_allclose(rng.alphas[0], 2.5 * np.array([0.5, 0.3, 0.15, 0.05]))
    left = np.bincount(labels, minlength=4)
    for alpha, part in zip(rng.alphas, parts, strict=True):
        alive = left > 0
        np.testing.assert_allclose(alpha, 2.5 * left[alive] / left.sum())  # the rows still unassigned
        left = left - np.bincount(labels[part], minlength=4)
    assert {len(p) for p in parts} == {100}  # 1000 // 10 each
    everything = np.concatenate(parts)
    assert np.unique(everything).size == everything.size == 1000  # without replacement


def test_prior_dirichlet_shares_follow_the_prior_with_total_mass_alpha() -> None:
    # A large pool so the prior barely moves: mean share ~ p, share variance ~ p (1 - p) / (alpha + 1).
    p = np.array([0.6, 0.3, 0.1])
    labels = np.repeat(np.arange(3), (p * 400_000).astype(int))
    for alpha in (1.0, 8.0):
        parts = partition.prior_dirichlet_split(labels, 400, alpha, np.random.default_rng(3), size=200)
        shares = np.stack([np.bincount(labels[part], minlength=3) / 200 for part in parts])
        np.testing.assert_allclose(shares.mean(0), p, atol=0.04)
        estimate = np.mean(p * (1 - p) / shares.var(0)) - 1  # ignores the small sampling noise
        assert 0.7 * alpha < estimate < 1.3 * alpha, (alpha, estimate)


def test_prior_dirichlet_fills_clients_when_classes_run_out() -> None:
    labels = np.repeat(np.arange(3), [90, 6, 4])
    parts = partition.prior_dirichlet_split(labels, 10, 0.05, np.random.default_rng(0))
    assert [len(p) for p in parts] == [10] * 10 and np.unique(np.concatenate(parts)).size == 100
    again = partition.prior_dirichlet_split(labels, 10, 0.05, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # same seed, same split
    with pytest.raises(ValueError, match="concentration must be a positive number"):
        partition.prior_dirichlet_split(labels, 10, 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rows are needed"):
        partition.prior_dirichlet_split(labels, 10, 1.0, np.random.default_rng(0), size=11)
