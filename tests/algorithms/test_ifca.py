"""algorithms/ifca.py: IFCA picks the lowest-loss model (ties, removed clusters, unseen clients)."""

import torch

from lightning_fedcluster.algorithms import IFCA
from lightning_fedcluster.algorithms.base import Contribution
from tests.helpers.algorithms import ctx, t

# --- IFCA --------------------------------------------------------------------------------------------


def test_ifca_picks_lowest_mean_loss_and_trains_only_it():
    losses = t([[1.0, 3.0, 2.0], [1.0, 0.0, 5.0]])  # means 1.0, 1.5, 3.5
    rule, context = IFCA(3), ctx([1 / 3] * 3, num_samples=2)
    report = rule.e_step(losses, torch.tensor([0, 1]), context, None)
    assert torch.equal(report.omega, t([1.0, 0, 0]))
    assert torch.equal(report.label_sums, t([[1.0, 0, 0], [1.0, 0, 0]]))
    plan = rule.local_plan(report, context)
    assert plan.clusters == (0,) and plan.sample_weights is None
    assert rule.contributions(report, plan, context) == [Contribution(0, 0, 2.0)]


def test_ifca_ties_go_to_the_lowest_index_and_removed_clusters_never_win():
    rule = IFCA(3)
    tie = rule.e_step(t([[2.0, 1.0, 1.0]]), torch.tensor([0]), ctx([1 / 3] * 3), None)
    assert torch.equal(tie.omega, t([0, 1.0, 0]))
    masked = rule.e_step(
        t([[2.0, 1.0, 1.0]]), torch.tensor([0]), ctx([1 / 3] * 3, active=[True, False, True]), None
    )
    assert torch.equal(masked.omega, t([0, 0, 1.0]))


def test_ifca_unseen_client_takes_the_lowest_loss_model():
    omega = IFCA(2).unseen_client_mixture(t([[3.0, 1.0], [3.0, 2.0]]), torch.tensor([0, 1]), None)
    assert torch.equal(omega, t([0, 1.0]))
    assert IFCA(2).prediction_weights(t([0.2, 0.8])).tolist() == [0.0, 1.0]
