"""algorithms/dfedem.py: D-FedEM's random connected graph, Metropolis weights and mixing, by hand."""

import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.base import ClientReport
from lightning_fedcluster.algorithms.dfedem import DFedEM, metropolis_weights, random_connected_graph
from tests.helpers.algorithms import (
    F64,
    TIGHT,
    ctx,
    t,
)

# --- D-FedEM ---------------------------------------------------------------------------------------------


def test_dfedem_graph_is_connected_seeded_and_its_weights_doubly_stochastic():
    graph = random_connected_graph(8, 0.3, seed=4)
    assert torch.equal(graph, random_connected_graph(8, 0.3, seed=4))
    assert torch.equal(graph, graph.T) and not bool(graph.diagonal().any())
    assert all(bool(graph[i, (i + 1) % 8]) for i in range(8))  # the ring keeps it connected
    weights = metropolis_weights(graph)
    assert_close(weights, weights.T, **TIGHT)
    assert_close(weights.sum(0), torch.ones(8, dtype=F64), **TIGHT)
    assert_close(weights.sum(1), torch.ones(8, dtype=F64), **TIGHT)
    assert bool((weights >= 0).all())


def test_dfedem_mixing_by_hand_on_a_path():
    # Path 0-1-2 (the ring on 3 nodes is a triangle, so build the path by hand): degrees 1, 2, 1.
    path = torch.tensor([[False, True, False], [True, False, True], [False, True, False]])
    weights = metropolis_weights(path)
    third = 1 / 3
    assert_close(weights, t([[1 - third, third, 0], [third, third, third], [0, third, 1 - third]]), **TIGHT)
    rule = DFedEM(2, edge_probability=1.0)
    personal = {0: torch.tensor([3.0, 0.0]), 1: torch.tensor([0.0, 3.0]), 2: torch.tensor([6.0, 6.0])}
    rule.mix_personal(personal, 0)  # complete graph on 3 nodes: every weight is 1/3
    for vector in personal.values():
        assert_close(vector, torch.tensor([3.0, 3.0]))
    plan = rule.local_plan(
        ClientReport(gamma=t([[0.5, 0.5]]), omega=t([0.5, 0.5]), label_sums=t([[0.5, 0.5]])), ctx([0.5, 0.5])
    )
    assert plan.from_personal and plan.clusters == (0, 1)
