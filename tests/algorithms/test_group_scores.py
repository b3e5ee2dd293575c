"""algorithms/group_scores.py: which group a client belongs to, against hand computations: the
mean score weighted by the labels shared, the margin, the mean-distance refinement against the
medoids, the groups too small for a cluster, and the late pass's cluster."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.group_scores import (
    confident,
    late_clusters,
    mean_distance_groups,
    mean_scores,
    medoid_scores,
    small_groups,
)

F64 = torch.float64
NAN = float("nan")


def test_mean_scores_weigh_each_member_by_the_labels_shared_and_skip_unknown_pairs():
    distances = torch.tensor(
        [[0, 0.2, 0.8, NAN], [0.2, 0, 0.6, 0.4], [0.8, 0.6, 0, 0.1], [NAN, 0.4, 0.1, 0]], dtype=F64
    )
    shared = torch.tensor([[3, 1, 2, 5], [1, 2, 1, 1], [2, 1, 3, 2], [5, 1, 2, 4]], dtype=F64)
    scores = mean_scores(distances, shared, torch.tensor([0, 0, 1, 1]))
    # Client 2 to group 0: (2 * 0.8 + 1 * 0.6) / 3; client 0 to group 1: only client 2 is known.
    expected = torch.tensor([[0.2, 0.8], [0.2, 0.5], [2.2 / 3, 0.1], [0.4, 0.1]], dtype=F64)
    assert_close(scores, expected)
    # A group with no other member (or no known one) scores +inf.
    alone = mean_scores(distances, shared, torch.tensor([0, 1, 1, 1]))
    assert alone[0, 0] == torch.inf and alone[1, 0] == pytest.approx(0.2)
    assert confident(scores, 0.3).tolist() == [True, False, True, True]  # 0.2 < 0.24, 0.2 >= 0.15, ...


def test_mean_assignment_moves_a_client_that_only_its_medoid_pair_put_in_a_group():
    # Clients 0, 1 and 3, 4 are pairs; client 2 is 0.3 from client 0 on one shared label, but 0.9
    # from client 1 and 0.4 from clients 3 and 4 on three.
    d = torch.full((5, 5), 0.9, dtype=F64)
    d.fill_diagonal_(0.0)
    d[0, 1] = d[1, 0] = d[3, 4] = d[4, 3] = 0.1
    d[2, 0] = d[0, 2] = 0.3
    d[2, 3] = d[3, 2] = d[2, 4] = d[4, 2] = 0.4
    w = torch.ones(5, 5, dtype=F64)
    w[2, 1] = w[1, 2] = w[2, 3] = w[3, 2] = w[2, 4] = w[4, 2] = 3.0
    start = torch.tensor([0, 0, 0, 1, 1])
    # Client 2 to group 0: (0.3 + 3 * 0.9) / 4 = 0.75, to group 1: 0.4. Then client 0 stays
    # (0.1 against (0.3 + 0.9 + 0.9) / 3 = 0.7), client 3 too (0.9 against (3 * 0.4 + 0.1) / 4).
    assert mean_distance_groups(d, w, start).tolist() == [0, 0, 1, 1, 1]
    # The medoid of {0, 1, 2} is client 0 (total distance 0.4), so by medoids client 2 stays.
    assert_close(medoid_scores(d, start)[2], torch.tensor([0.3, 0.4], dtype=F64))


def test_late_pass_picks_the_cluster_whose_grouped_members_are_closest_on_average():
    # Clients 0, 1 grouped in cluster 1, client 2 in cluster 0 (its ω is largest on cluster 2, which
    # is dead); clients 3 and 4 ungrouped (their own ω: argmax cluster 0).
    d = torch.tensor(
        [
            [0.0, 0.1, 0.9, 0.2, 0.5],
            [0.1, 0.0, 0.9, 0.6, 0.5],
            [0.9, 0.9, 0.0, 0.45, 0.6],
            [0.2, 0.6, 0.45, 0.0, 0.0],
            [0.5, 0.5, 0.6, 0.0, 0.0],
        ],
        dtype=F64,
    )
    w = torch.ones(5, 5, dtype=F64)
    w[3, 1] = w[1, 3] = w[3, 4] = w[4, 3] = 3.0
    w[3, 2] = w[2, 3] = 2.0
    omega = torch.tensor(
        [[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.3, 0.2, 0.5], [0.4, 0.3, 0.3], [0.4, 0.3, 0.3]], dtype=F64
    )
    active = torch.tensor([True, True, False])
    grouped = torch.tensor([True, True, True, False, False])
    clusters = late_clusters(d, w, omega, active, grouped)
    # Client 3: cluster 1 (1 * 0.2 + 3 * 0.6) / 4 = 0.5, cluster 0 0.45 -> 0 (unweighted: 0.4 -> 1).
    # Client 4: cluster 1 0.5, cluster 0 0.6 -> 1; client 3 (distance 0) does not vote.
    assert clusters[3:].tolist() == [0, 1]
    assert late_clusters(d, torch.ones(5, 5, dtype=F64), omega, active, grouped)[3] == 1
    # No grouped member shares a label with client 4: -1.
    w[4, :3] = w[:3, 4] = 0.0
    assert late_clusters(d, w, omega, active, grouped)[4] == -1


def test_small_groups_are_those_whose_sure_members_hold_under_the_share_of_all_rows():
    groups = torch.tensor([0, 0, 1, 1, 2])
    sure = torch.tensor([True, True, True, False, True])
    rows = torch.tensor([30.0, 30.0, 10.0, 20.0, 10.0])  # 100 rows in all
    # Sure rows per group: 60, 10 (client 3 is not sure), 10: groups 1 and 2 under 0.15 of 100.
    assert small_groups(groups, sure, rows, 0.15).tolist() == [False, False, True, False, True]
    assert small_groups(groups, sure, rows, 0.1).tolist() == [False] * 5  # 10 is not under 10
