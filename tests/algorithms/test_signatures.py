"""Client signatures: label-conditioned means, their distances on shared labels, and grouping,
checked against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedcluster.algorithms.signatures import (
    canonical_labels,
    client_signature,
    fill_unknown,
    group_clients,
    k_medoids,
    label_conditioned_means,
    signature_distances,
)


def test_label_conditioned_means_average_the_rows_of_each_label():
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.2, 0.8]])
    labels = torch.tensor([0, 0, 2, 2])
    means, counts = label_conditioned_means(values, labels, 3)
    torch.testing.assert_close(
        means, torch.tensor([[0.5, 0.5], [0.0, 0.0], [0.35, 0.65]], dtype=torch.float64)
    )
    torch.testing.assert_close(counts, torch.tensor([2.0, 0.0, 2.0], dtype=torch.float64))


def test_distances_compare_clients_only_on_the_labels_both_hold():
    # Client 0 holds labels 0 and 1, client 1 labels 1 and 2, client 2 label 2 only.
    means = torch.zeros(3, 3, 2, dtype=torch.float64)
    means[0, 0] = torch.tensor([1.0, 0.0])
    means[0, 1] = torch.tensor([0.0, 1.0])
    means[1, 1] = torch.tensor([0.5, 0.5])
    means[1, 2] = torch.tensor([1.0, 0.0])
    means[2, 2] = torch.tensor([0.0, 1.0])
    counts = torch.tensor([[3.0, 2.0, 0.0], [0.0, 4.0, 1.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    distances, shared = signature_distances(means, counts, metric="tv")
    # 0 vs 1: label 1 only, 0.5 * (|0 - 0.5| + |1 - 0.5|) = 0.5; 1 vs 2: label 2, 0.5 * (1 + 1) = 1.
    assert distances[0, 1] == pytest.approx(0.5) and distances[1, 0] == pytest.approx(0.5)
    assert distances[1, 2] == pytest.approx(1.0)
    assert math.isnan(float(distances[0, 2])) and not bool(shared[0, 2])
    assert bool(shared[0, 1]) and float(distances[0, 0]) == 0.0
    # min_rows 2: client 1 no longer holds label 2, so 1 vs 2 share nothing.
    distances, shared = signature_distances(means, counts, min_rows=2, metric="tv")
    assert math.isnan(float(distances[1, 2])) and not bool(shared[1, 2])


def test_the_cosine_distance_compares_rows_centred_on_their_mean():
    means = torch.zeros(3, 1, 3, dtype=torch.float64)
    means[0, 0] = torch.tensor([0.5, 0.3, 0.2])  # centred: [0.1667, -0.0333, -0.1333]
    means[1, 0] = torch.tensor([0.4, 0.32, 0.28])  # centred: [0.0667, -0.0133, -0.0533], the same direction
    means[2, 0] = torch.tensor([0.2, 0.3, 0.5])  # centred: [-0.1333, -0.0333, 0.1667]
    counts = torch.ones(3, 1, dtype=torch.float64)
    distances, _ = signature_distances(means, counts)
    assert float(distances[0, 1]) == pytest.approx(0.0, abs=1e-12)  # a less confident model, same rule
    # cos = (0.1667 * -0.1333 + 0.0333 * 0.0333 - 0.1333 * 0.1667) / (0.0467) = -0.0433 / 0.0467
    assert float(distances[0, 2]) == pytest.approx(1 + 0.04333333 / 0.04666667, rel=1e-6)
    with pytest.raises(ValueError, match="metric must be"):
        signature_distances(means, counts, metric="l2")


def test_k_medoids_keeps_a_far_client_with_its_own_concept():
    # A = {0, 1}, B = {2, 3}, 0.1 apart inside, 0.5 between; client 4 is 0.6 from A, 0.95 from B.
    d = torch.full((5, 5), 0.5, dtype=torch.float64)
    d[0, 1] = d[1, 0] = d[2, 3] = d[3, 2] = 0.1
    d[4, :2] = d[:2, 4] = 0.6
    d[4, 2:4] = d[2:4, 4] = 0.95
    d.fill_diagonal_(0.0)
    groups, cost = k_medoids(d, 2)
    assert groups.tolist() == [0, 0, 1, 1, 0]
    assert cost == pytest.approx(0.1 + 0.1 + 0.6)
    # Complete linkage puts the far client alone and merges the two concepts.
    assert group_clients(d, num_groups=2).tolist() == [0, 0, 0, 0, 1]
    again, _ = k_medoids(d, 2, seed=5)
    assert again.tolist() == groups.tolist()


def test_a_pair_with_no_shared_label_counts_as_the_largest_known_distance():
    d = torch.tensor([[0.0, 0.2, math.nan], [0.2, 0.0, 0.7], [math.nan, 0.7, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(fill_unknown(d)[0, 2], torch.tensor(0.7, dtype=torch.float64))


def test_grouping_by_count_and_by_threshold():
    # Two tight pairs {0, 2} and {1, 3}, 0.1 apart inside, 0.9 between.
    d = torch.full((4, 4), 0.9, dtype=torch.float64)
    d[0, 2] = d[2, 0] = d[1, 3] = d[3, 1] = 0.1
    d.fill_diagonal_(0.0)
    assert group_clients(d, num_groups=2).tolist() == [0, 1, 0, 1]
    assert group_clients(d, threshold=0.5).tolist() == [0, 1, 0, 1]
    assert group_clients(d, threshold=0.95).tolist() == [0, 0, 0, 0]  # complete linkage 0.9 < 0.95
    assert group_clients(d, threshold=0.05).tolist() == [0, 1, 2, 3]
    assert group_clients(d, num_groups=1).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="exactly one of num_groups and threshold"):
        group_clients(d)


def test_group_numbers_follow_the_first_member():
    assert canonical_labels(torch.tensor([2, 2, 0, 1, 0])).tolist() == [0, 0, 1, 2, 1]


def test_the_signature_is_the_alive_models_mean_prediction_per_label():
    outputs = torch.tensor(
        [
            [[0.8, 0.2], [0.6, 0.4], [0.1, 0.9]],  # model 0 on three rows
            [[0.4, 0.6], [0.2, 0.8], [0.3, 0.7]],  # model 1
            [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]],  # model 2, removed
        ]
    )
    labels = torch.tensor([1, 1, 0])
    means, counts = client_signature(outputs, labels, torch.tensor([True, True, False]), 2)
    # label 1: rows 0 and 1, model mean [0.6, 0.4] and [0.4, 0.6] -> [0.5, 0.5]; label 0: row 2 -> [0.2, 0.8]
    torch.testing.assert_close(means, torch.tensor([[0.2, 0.8], [0.5, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(counts, torch.tensor([1.0, 2.0], dtype=torch.float64))
