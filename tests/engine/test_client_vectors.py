"""engine/client_vectors.py: which flat vector a client sends after a round (personal model, trained copy
or update), where personal models start, and FeSEM's distances to the global models, on K copies
of ``nn.Linear(2, 1)`` (3 numbers each: weight [1, 2], then bias [1]) with hand-set values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lightning_fedcluster.algorithms import CFL, DFedEM, FedRC, FedSoft, FeSEM
from lightning_fedcluster.algorithms.client_turn import LocalPlan
from lightning_fedcluster.engine import client_vectors
from lightning_fedcluster.engine.copies import ClusterCopies


def linear_copies(*values: list[float]) -> ClusterCopies:
    """One Linear(2, 1) per list of its 3 numbers (weight then bias)."""
    copies = ClusterCopies(nn.ModuleList(nn.Linear(2, 1) for _ in values))
    for k, numbers in enumerate(values):
        copies.write_vector(torch.tensor(numbers), [k])
    return copies


def global_models(*values: list[float]) -> list[list[torch.Tensor]]:
    return [[torch.tensor([numbers[:2]]), torch.tensor(numbers[2:])] for numbers in values]


def work_on(cluster: int) -> SimpleNamespace:
    return SimpleNamespace(plan=LocalPlan(clusters=(cluster,)))


@pytest.mark.parametrize(
    ("rule", "state", "kind", "size"),
    [
        (FedSoft(3), None, "personal", 3),  # copy 0 holds the personal model
        (DFedEM(3), None, "personal", 9),  # all K copies
        (CFL(3), None, "update", 3),
        (FeSEM(3), SimpleNamespace(extra={"centres_ready": torch.tensor(0.0)}), "model", 3),
        (FeSEM(3), None, None, 0),
        (FedRC(3), None, None, 0),
    ],
)
def test_the_vector_a_rule_asks_for_and_its_length(rule, state, kind, size):
    copies = linear_copies([0.0] * 3, [0.0] * 3, [0.0] * 3)
    assert client_vectors.vector_kind(rule, state) == kind
    assert client_vectors.vector_size(copies, rule, state) == size
    assert list(client_vectors.personal_copies(rule, 3)) == ([0, 1, 2] if isinstance(rule, DFedEM) else [0])


def test_an_update_is_the_trained_copy_minus_its_global_model():
    copies = linear_copies([9.0, 9.0, 9.0], [1.0, 2.0, 3.0])
    clusters = global_models([0.0, 0.0, 0.0], [0.5, 0.5, 1.0])
    update = client_vectors.round_vector(copies, CFL(2), None, clusters, work_on(1))
    assert update.tolist() == [0.5, 1.5, 2.0]
    ready = SimpleNamespace(extra={"centres_ready": torch.tensor(0.0)})
    assert client_vectors.round_vector(copies, FeSEM(2), ready, clusters, work_on(1)).tolist() == [
        1.0,
        2.0,
        3.0,
    ]


def test_personal_models_are_read_from_their_copies():
    copies = linear_copies([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert client_vectors.round_vector(copies, FedSoft(2), None, [], work_on(1)).tolist() == [1.0, 2.0, 3.0]
    assert client_vectors.round_vector(copies, DFedEM(2), None, [], work_on(0)).tolist() == [
        1.0,
        2.0,
        3.0,
        4.0,
        5.0,
        6.0,
    ]


def test_a_personal_model_starts_from_the_store_or_else_from_the_rules_global_model():
    clusters = global_models([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0])
    context = SimpleNamespace(extra={"importance": torch.tensor([0.1, 0.2, 0.7])})  # FedSoft: argmax u
    copies = linear_copies([0.0] * 3, [0.0] * 3, [0.0] * 3)
    client_vectors.load_personal(copies, FedSoft(3), SimpleNamespace(personal={}), clusters, 5, context)
    assert copies.read_vector([0, 1, 2]).tolist() == [3.0, 3.0, 3.0] + [0.0] * 6  # copy 0 only
    store = SimpleNamespace(personal={5: torch.tensor([7.0, 8.0, 9.0])})
    client_vectors.load_personal(copies, FedSoft(3), store, clusters, 5, context)
    assert copies.read_vector([0]).tolist() == [7.0, 8.0, 9.0]
    client_vectors.load_personal(copies, DFedEM(3), SimpleNamespace(personal={}), clusters, 5, context)
    assert (
        copies.read_vector([0, 1, 2]).tolist() == [1.0] * 3 + [2.0] * 3 + [3.0] * 3
    )  # copy k from cluster k


def test_distances_are_squared_over_the_representation_layers():
    copies = linear_copies([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    clusters = global_models([1.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    # ‖(1, 2, 3) − G_j‖²: G_0 = (1, 0, 0) → 0 + 4 + 9; G_1 = (0, 0, 1) → 1 + 4 + 4
    distances = client_vectors.distances(copies, FeSEM(2), clusters, 0)  # every layer by default
    assert distances.dtype == torch.float64 and distances.tolist() == [13.0, 9.0]
    weight_only = FeSEM(2, representation_layers=("weight",))  # the bias is left out
    assert client_vectors.distances(copies, weight_only, clusters, 0).tolist() == [4.0, 5.0]
