"""algorithms/cfl.py: CFL's cosine similarity, bi-partition, split decision and plan, by hand."""

import math

import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.cfl import CFL, bipartition, cosine_similarity_matrix, split_decision
from tests.helpers.algorithms import (
    F64,
    TIGHT,
    t,
)

# --- CFL -------------------------------------------------------------------------------------------------


def test_cfl_cosine_similarity_and_bipartition():
    updates = t([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.05], [-0.8, -0.1]])
    similarity = cosine_similarity_matrix(updates)
    assert_close(similarity[0, 1], t(0.9 / math.sqrt(0.82)), **TIGHT)
    assert_close(similarity.diagonal(), torch.ones(4, dtype=F64), **TIGHT)
    assert bipartition(similarity).tolist() == [False, False, True, True]


def test_cfl_split_decision_thresholds():
    opposite = t([[2.0, 0.0], [-2.0, 0.0]])  # mean 0 (stationary), members move a lot
    assert split_decision(opposite, t([1.0, 1.0]), eps1=0.4, eps2=1.6)
    assert not split_decision(opposite, t([1.0, 1.0]), eps1=0.4, eps2=2.5)  # no member moves enough
    assert not split_decision(opposite, t([3.0, 1.0]), eps1=0.4, eps2=1.6)  # weighted mean = 1.0 > ε1
    assert not split_decision(opposite[:1], t([1.0]), eps1=10, eps2=0.1)  # a single member never splits


def test_cfl_plan_splits_uses_a_free_cluster_and_starts_with_one():
    rule = CFL(3, eps1=0.4, eps2=1.6)
    assert rule.initial_active().tolist() == [True, False, False]
    clusters = torch.tensor([0, 0, 0, 0])
    updates = t([[2.0, 0.0], [1.9, 0.1], [-2.0, 0.0], [-1.9, -0.1]])
    splits = rule.plan_splits(clusters, updates, torch.ones(4), torch.tensor([True, False, False]))
    assert len(splits) == 1
    parent, child, moving = splits[0]
    assert (parent, child, moving.tolist()) == (0, 1, [False, False, True, True])
    # No free cluster left: no split.
    assert rule.plan_splits(clusters, updates, torch.ones(4), torch.ones(3, dtype=torch.bool)) == []
