"""FedSoft mixture partitions: the paper's patterns, exact counts and the draw (fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fedcluster.datamodules import partition
from tests.datamodules.partition.test_label_skew import assert_disjoint, rng


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
