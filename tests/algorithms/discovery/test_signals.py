"""The discovery signals on hand-computed cases."""

import math

import pytest
import torch

from lightning_fedcluster.algorithms.discovery.signals import (
    best_partition,
    churn,
    fit_margins,
    partition_agreement,
    relative_fit,
    silhouette,
)


def pairs(within: float, across: float, count: int = 3) -> torch.Tensor:
    """Distances of ``count`` tight pairs of clients: ``within`` inside a pair, ``across`` else."""
    groups = torch.arange(2 * count) // 2
    same = groups[:, None] == groups[None, :]
    distances = torch.where(same, torch.tensor(within), torch.tensor(across)).to(torch.float64)
    return distances.fill_diagonal_(0.0)


def test_silhouette_of_two_pairs_is_two_thirds() -> None:
    # client 0: a = d(0, 1) = 1, b = mean(d(0, 2), d(0, 3)) = 3: s = (3 - 1) / 3; all four alike
    distances = pairs(1.0, 3.0, count=2)
    assert silhouette(distances, torch.tensor([0, 0, 1, 1])) == pytest.approx(2 / 3)


def test_silhouette_of_one_group_and_of_singletons_is_zero() -> None:
    distances = pairs(1.0, 3.0, count=2)
    assert silhouette(distances, torch.zeros(4, dtype=torch.long)) == 0.0
    assert silhouette(distances, torch.arange(4)) == 0.0


def test_silhouette_stays_within_one_where_rounding_makes_a_distance_negative() -> None:
    # 1 - cos of equal rows rounds to about -1e-7: client 0's a = -1e-7 and b = 1e-8 gave
    # s = (b - a) / max(a, b) = 11; read as 0, a = 0 and s = 1
    near, far = -1e-7, 1e-8
    distances = torch.tensor(
        [[0.0, near, far, far], [near, 0.0, far, far], [far, far, 0.0, near], [far, far, near, 0.0]],
        dtype=torch.float64,
    )
    assert silhouette(distances, torch.tensor([0, 0, 1, 1])) == pytest.approx(1.0)


def test_best_partition_measures_the_number_of_groups() -> None:
    groups, score = best_partition(pairs(0.1, 2.0), max_groups=5)
    assert groups.tolist() == [0, 0, 1, 1, 2, 2]
    assert score == pytest.approx((2.0 - 0.1) / 2.0)


def test_best_partition_of_noise_is_not_separated() -> None:
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(20, 2, generator=generator, dtype=torch.float64)
    _, score = best_partition(torch.cdist(points, points), max_groups=4)
    assert score < 0.5


def test_partition_agreement_ignores_labels() -> None:
    assert partition_agreement(torch.tensor([0, 0, 1, 1]), torch.tensor([1, 1, 0, 0])) == 1.0
    assert partition_agreement(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])) < 0


def test_relative_fit_subtracts_each_clusters_median() -> None:
    scores = torch.tensor([[-1.0, -2.0], [-1.5, -1.0], [-1.2, -1.6]], dtype=torch.float64)
    fit = relative_fit(scores, torch.tensor([True, True]))
    expected = torch.tensor([[0.2, -0.4], [-0.3, 0.6], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(fit, expected)
    best, margin = fit_margins(scores[:2], torch.tensor([True, True]))
    # over the first two clients the medians are the means: (-1.25, -1.5)
    assert best.tolist() == [0, 1]
    torch.testing.assert_close(margin, torch.tensor([0.75, 0.75], dtype=torch.float64))


def test_a_share_of_the_median_weighs_the_score_against_the_clusters_lead() -> None:
    scores = torch.tensor([[-1.0, -2.0], [-1.5, -1.0], [-1.2, -1.6]], dtype=torch.float64)
    # medians -1.2 and -1.6; half of them: -0.6 and -0.8
    fit = relative_fit(scores, torch.tensor([True, True]), median_share=0.5)
    expected = torch.tensor([[-0.4, -1.2], [-0.9, -0.2], [-0.6, -0.8]], dtype=torch.float64)
    torch.testing.assert_close(fit, expected)
    best, margin = fit_margins(scores, torch.tensor([True, True]), median_share=0.0)
    assert best.tolist() == [0, 1, 0]  # the score itself
    torch.testing.assert_close(margin, torch.tensor([1.0, 0.5, 0.4], dtype=torch.float64))


def test_a_model_better_for_everyone_places_nobody() -> None:
    scores = torch.tensor([[-1.0, -3.0], [-1.1, -3.1], [-0.9, -2.9]], dtype=torch.float64)
    _, margin = fit_margins(scores, torch.tensor([True, True]))
    assert float(margin.abs().max()) < 1e-12


def test_dead_clusters_never_win() -> None:
    scores = torch.tensor([[-1.0, 5.0, -2.0], [-2.0, 5.0, -1.0], [-1.5, 0.0, -1.5]], dtype=torch.float64)
    best, margin = fit_margins(scores, torch.tensor([True, False, True]))
    assert best.tolist()[:2] == [0, 2]
    assert float(margin[0]) == pytest.approx(1.0)
    _, one = fit_margins(scores, torch.tensor([True, False, False]))
    assert all(math.isinf(m) for m in one.tolist())


def test_churn_counts_changes_and_first_assignments() -> None:
    assert churn(torch.tensor([0, 1, -1]), torch.tensor([0, 2, 1])) == pytest.approx(2 / 3)
    assert churn(torch.tensor([0, 1]), torch.tensor([0, 1])) == 0.0
