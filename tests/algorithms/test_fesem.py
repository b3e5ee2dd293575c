"""algorithms/fesem.py: FeSEM/WeCFL's seeded first assignment, nearest-centre reassignment,
representation layers and K-means initialisation, by hand."""

import pytest
import torch

from lightning_fedcluster.algorithms import FeSEM, initial_assignment
from lightning_fedcluster.algorithms.actions import Reassign, SetCentre, SetState
from lightning_fedcluster.algorithms.base import Contribution
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from tests.helpers.algorithms import ctx, server_view, store, t

# --- FeSEM / WeCFL ------------------------------------------------------------------------------------


def test_fesem_first_assignment_is_seeded_and_then_kept():
    rule = FeSEM(3, seed=5)
    first = rule.e_step(t([[0.0, 0.0, 0.0]]), torch.tensor([0]), ctx([1 / 3] * 3, client=7), None)
    k = initial_assignment(5, 7, torch.ones(3, dtype=torch.bool))
    assert torch.equal(first.omega, torch.nn.functional.one_hot(torch.tensor(k), 3).double())
    # Deterministic, and different clients spread over clusters.
    draws = {initial_assignment(5, c, torch.ones(3, dtype=torch.bool)) for c in range(30)}
    assert draws == {0, 1, 2}
    kept = rule.e_step(t([[0.0, 0.0, 0.0]]), torch.tensor([0]), ctx([0, 0, 1.0], seen=True), None)
    assert torch.equal(kept.omega, t([0, 0, 1.0]))
    # A client whose cluster was removed draws again among the survivors.
    moved = rule.e_step(
        t([[0.0, 0.0, 0.0]]),
        torch.tensor([0]),
        ctx([0, 0, 1.0], seen=True, active=[True, False, False]),
        None,
    )
    assert torch.equal(moved.omega, t([1.0, 0, 0]))


@pytest.mark.parametrize(("weighted", "weight"), [(False, 1.0), (True, 4.0)])
def test_fesem_reassigns_to_the_nearest_centre_with_fesem_or_wecfl_weight(weighted, weight):
    rule = FeSEM(3, weighted=weighted)
    context = ctx([1.0, 0, 0], seen=True, num_samples=4)
    report = rule.e_step(t([[0.0, 0.0, 0.0]] * 4), torch.tensor([0, 1, 0, 1]), context, None)
    plan = rule.local_plan(report, context)
    assert plan.clusters == (0,)
    moved = rule.reassign(report, t([5.0, 0.5, 2.0]), context)
    assert torch.equal(moved.omega, t([0, 1.0, 0]))
    # Trained copy 0 goes into its new cluster 1: Δ = θ_local − θ_1.
    assert rule.contributions(moved, plan, context) == [Contribution(0, 1, weight)]
    masked = rule.reassign(report, t([5.0, 0.5, 2.0]), ctx([1.0, 0, 0], active=[True, False, True]))
    assert torch.equal(masked.omega, t([0, 0, 1.0]))


def test_fesem_representation_layers():
    names = ["features.0.weight", "features.0.bias", "head.weight", "head.bias"]
    assert FeSEM(2).representation_mask(names) == [True] * 4
    assert FeSEM(2, representation_layers=("head",)).representation_mask(names) == [False, False, True, True]
    with pytest.raises(ValueError, match="representation_layers"):
        FeSEM(2, representation_layers=("nothing",)).representation_mask(names)


def test_fesem_kmeans_initialisation_from_local_models():
    rule = FeSEM(2, seed=1)
    not_ready = {"centres_ready": torch.tensor(0.0)}
    report = rule.e_step(t([[0.0, 0.0]]), torch.tensor([0]), ctx([0.5, 0.5], client=3, extra=not_ready), None)
    assert torch.equal(report.omega, t([1.0, 0.0]))  # everybody trains the common model 0 first
    same = rule.reassign(report, t([9.0, 0.0]), ctx([0.5, 0.5], extra=not_ready))
    assert torch.equal(same.omega, report.omega)  # the server assigns after the first round
    state = store(rule, 4, num_samples=8)
    assert rule.round_vectors(state) == "model"
    vectors = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.0, 4.9]])
    centres, assignment = rule.initial_centres(vectors, 0, torch.ones(2, dtype=torch.bool))
    rows = sorted(centres.values())
    assert (
        len(set(rows)) == 2
        and centres == rule.initial_centres(vectors, 0, torch.ones(2, dtype=torch.bool))[0]
    )
    for row, cluster in enumerate(assignment.tolist()):  # every model joins its nearest centre
        nearest = min(centres, key=lambda k: float((vectors[row] - vectors[centres[k]]).square().sum()))
        assert cluster == nearest
    # As server actions: the picked models become the centres, every client its nearest, ready.
    clients = torch.tensor([10, 11, 12, 13])
    outcome = RoundOutcome(0, clients, t([[1.0, 0.0]] * 4), torch.ones(4), torch.ones(14), vectors)
    actions = rule.after_round(server_view(state, outcome))
    set_centres = {a.cluster: a.vector.tolist() for a in actions if isinstance(a, SetCentre)}
    assert set_centres == {k: vectors[r].tolist() for k, r in centres.items()}
    (moved,) = [a for a in actions if isinstance(a, Reassign)]
    assert moved.clients.tolist() == clients.tolist()
    assert moved.omega.argmax(1).tolist() == assignment.tolist()
    ready = [a for a in actions if isinstance(a, SetState) and a.name == "centres_ready"]
    assert len(ready) == 1 and float(ready[0].value) == 1.0
    state.extra["centres_ready"] = torch.tensor(1.0)
    assert rule.round_vectors(state) is None
