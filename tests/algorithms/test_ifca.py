"""algorithms/ifca.py: IFCA picks the lowest-loss model (ties, removed clusters, unseen clients), and
runs discovery components (merging and retirement, by hand and through a fit on both executors)."""

import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms import IFCA
from lightning_fedcluster.algorithms.actions import MergeClusters, RemoveClusters
from lightning_fedcluster.algorithms.base import Contribution
from lightning_fedcluster.algorithms.discovery.merging import ClusterMerging
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES
from lightning_fedcluster.algorithms.discovery.retirement import ClusterRetirement
from tests.helpers.algorithms import ctx, store, t, view_at

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


# --- IFCA with discovery components ---------------------------------------------------------------


def test_ifca_reports_its_scores_without_label_statistics_and_retires_an_unowned_cluster():
    rule = IFCA(3, components=(ClusterMerging(0.5), ClusterRetirement(0)))
    assert [e.name for e in rule.state_entries()] == [CLUSTER_SCORES]
    losses = t([[0.2, 0.6, 3.0], [0.4, 0.2, 2.0]])  # means 0.3, 0.4, 2.5: cluster 0
    context = ctx([1 / 3] * 3, num_samples=2)
    log_c = t([[-0.1, -2.0, -0.5], [-0.3, -0.2, -0.9]])  # given, and left out: IFCA has no C
    report = rule.e_step(losses, torch.tensor([0, 1]), context, log_c)
    assert torch.equal(report.omega, t([1.0, 0, 0]))
    assert_close(context.extra[CLUSTER_SCORES], t([-0.3, -0.4, -2.5]), rtol=0, atol=1e-15)
    # After a round: clients 0 and 1 own cluster 0, client 2 cluster 1; nobody owns cluster 2, and
    # the pair (0, 1) differs by more than 0.5 nats, so the round's K decision is the retirement.
    state = store(rule, 3)
    state.seen[:] = True
    state.omega.copy_(t([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]]))
    state.extra[CLUSTER_SCORES] = t([[-0.3, -1.3, -2.5], [-0.5, -1.5, -3.0], [-2.0, -0.1, -2.0]])
    remove, note = rule.after_round(view_at(state, 4, [10, 10, 20]).server)
    assert isinstance(remove, RemoveClusters) and remove.mask.tolist() == [False, False, True]
    assert "retired cluster(s) [2]" in note.text


def test_ifca_merges_two_identical_clusters():
    # Clusters 0 and 1 hold the same model: each client scores them alike. Gaps (size-weighted mean
    # |s_ik − s_il| over both clusters' members): (0, 1) = 0; (0, 2) = (10 · 2.2 + 20 · 1.9) / 30 = 2.0;
    # (1, 2) = (10 · 2.5 + 20 · 1.9) / 30 = 2.1. Shares 1/4 and 1/4: the tie keeps cluster 0.
    rule = IFCA(3, components=(ClusterMerging(0.5), ClusterRetirement(0)))
    state = store(rule, 3)
    state.seen[:] = True
    state.omega.copy_(t([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]))
    state.extra[CLUSTER_SCORES] = t([[-0.3, -0.3, -2.5], [-0.5, -0.5, -3.0], [-2.0, -2.0, -0.1]])
    merge, note = rule.after_round(view_at(state, 4, [10, 10, 20]).server)
    assert merge == MergeClusters(target=0, source=1)
    assert "merged cluster 1 into cluster 0" in note.text and "gap 0.000" in note.text


def test_ifca_with_merging_and_retirement_fits_the_same_on_both_executors():
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    def fit(executor: str):
        torch.manual_seed(0)
        rule = IFCA(6, components=(ClusterMerging(0.5, after=1), ClusterRetirement(1)))
        strategy = lf.FederatedStrategy(algorithm=rule, clients_per_round=6, local_steps=2, executor=executor)
        trainer = make_trainer(strategy, max_epochs=3)
        trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0))
        return trainer.lightning_module

    loop, vectorized = fit("loop"), fit("vectorized")
    assert 1 <= int(loop.client_state.active.sum()) < 6  # clusters nobody chose are retired
    assert torch.equal(vectorized.client_state.active, loop.client_state.active)
    assert torch.equal(vectorized.client_state.omega, loop.client_state.omega)
    for name, tensor in loop.state_dict().items():
        assert_close(vectorized.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
