"""algorithms/fedsoft.py: FedSoft's importance weights, selection probabilities, client selection,
plan and contributions, by hand."""

import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.base import Contribution
from lightning_fedcluster.algorithms.fedsoft import (
    FedSoft,
    importance_weights,
    select_clients,
    selection_probabilities,
)
from tests.helpers.algorithms import F64, TIGHT, ctx, store, t

# --- FedSoft ---------------------------------------------------------------------------------------------


def test_fedsoft_importance_weights_by_hand():
    # argmin per sample: 0, 1, 0, 0 (tie → lowest index) → n = [3, 1], u = [0.75, 0.25]
    losses = t([[1.0, 2.0], [3.0, 0.0], [0.0, 5.0], [2.0, 2.0]])
    assert_close(importance_weights(losses, torch.ones(2, dtype=torch.bool)), t([0.75, 0.25]), **TIGHT)
    # A cluster that wins no sample gets the smoother σ.
    assert_close(
        importance_weights(t([[0.0, 1.0]] * 3), torch.ones(2, dtype=torch.bool), 1e-4), t([1.0, 1e-4])
    )
    # A removed cluster gets 0 and never wins.
    assert_close(importance_weights(losses, torch.tensor([True, False])), t([1.0, 0.0]))


def test_fedsoft_selection_probabilities_by_hand():
    u = t([[0.75, 0.25], [1e-4, 0.9999]])
    sizes = torch.tensor([4, 2])
    v = selection_probabilities(u, sizes)  # mass u_ik N_i = [[3, 1], [2e-4, 1.9998]]
    assert_close(v, t([[3 / 3.0002, 2e-4 / 3.0002], [1 / 2.9998, 1.9998 / 2.9998]]), **TIGHT)
    assert_close(v.sum(1), t([1.0, 1.0]), **TIGHT)


def test_fedsoft_selects_selection_size_clients_per_active_cluster():
    u = torch.rand(20, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    sizes = torch.randint(5, 50, (20,), generator=torch.Generator().manual_seed(1))
    active = torch.tensor([True, True, False])
    a = select_clients(u, sizes, 4, active, torch.Generator().manual_seed(3))
    b = select_clients(u, sizes, 4, active, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert a[:, :2].sum(0).tolist() == [4, 4] and int(a[:, 2].sum()) == 0
    # A client whose weight is the smoother is (almost) never picked when others dominate.
    skewed = torch.full((10, 1), 1e-4, dtype=F64)
    skewed[:3] = 1.0
    picks = torch.zeros(10)
    for s in range(200):
        picks += select_clients(
            skewed, torch.ones(10), 3, torch.ones(1, dtype=torch.bool), torch.Generator().manual_seed(s)
        )[:, 0]
    assert picks[:3].tolist() == [200, 200, 200]


def test_fedsoft_plan_and_contributions():
    rule = FedSoft(3, proximal=0.5)
    extra = {"importance": t([0.6, 0.3, 0.1])}
    context = ctx([1 / 3] * 3, extra=extra, num_samples=5, membership=torch.tensor([True, False, True]))
    report = rule.e_step(t([[0.0, 1.0, 2.0]] * 5), torch.tensor([0, 1, 0, 1, 0]), context, None)
    assert_close(report.omega, t([0.6, 0.3, 0.1]), **TIGHT)
    plan = rule.local_plan(report, context)
    assert plan.from_personal and plan.clusters == (0,)
    assert plan.proximal == (((0, 0.3), (1, 0.15), (2, 0.05)),)
    # The personal model enters every cluster that selected the client, with weight 1 (a plain mean).
    assert rule.contributions(report, plan, context) == [Contribution(0, 0, 1.0), Contribution(0, 2, 1.0)]
    assert rule.initial_personal_cluster(context) == 0
    state = store(rule, 4, num_samples=10)
    assert rule.needs_estimation(0, state) and not rule.needs_estimation(1, state)
    state.extra["estimated_round"] = torch.tensor(0.0)
    assert not rule.needs_estimation(0, state) and rule.needs_estimation(2, state)
    assert rule.max_clients_per_round(100) == 30 and rule.max_clients_per_round(12) == 12
