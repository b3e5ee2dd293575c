"""algorithms/discovery/merging.py: merging near-identical clusters, against hand computations: the pair gaps,
which cluster retires into which, the store's merge, the scores a client reports, and a fit."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import MergeClusters, Note
from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.merging import ClusterMerging, closest_pair, pair_gaps
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES, client_scores
from lightning_fedcluster.algorithms.fedrc import FedRC
from tests.helpers.algorithms import store, view_at

F64 = torch.float64


def _state() -> tuple[ClientState, torch.Tensor]:
    """Clients 0, 1 in cluster 0, client 2 in cluster 1, client 3 in cluster 2."""
    state = ClientState.initial(4, 2, 3, ClusterMerging(threshold=1.0).state_entries(3))
    state.seen[:] = True
    state.omega.copy_(
        torch.tensor([[0.8, 0.1, 0.1], [0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.0, 0.1, 0.9]], dtype=F64)
    )
    state.label_sums[:, 0] = state.omega * 10
    state.extra[CLUSTER_SCORES] = torch.tensor(
        [[-1.0, -1.2, -5.0], [-1.1, -1.0, -4.0], [-2.0, -1.5, -6.0], [-7.0, -6.0, -0.5]], dtype=F64
    )
    return state, torch.tensor([10, 20, 10, 40])


def test_the_gap_of_a_pair_is_the_size_weighted_mean_over_both_clusters_members():
    state, sizes = _state()
    gaps = pair_gaps(state.omega, state.extra[CLUSTER_SCORES], sizes, state.seen, state.active)
    # (0, 1): clients 0, 1, 2: (10 * 0.2 + 20 * 0.1 + 10 * 0.5) / 40
    assert gaps[(0, 1)] == pytest.approx(9 / 40)
    # (0, 2): clients 0, 1, 3: (10 * 4 + 20 * 2.9 + 40 * 6.5) / 70
    assert gaps[(0, 2)] == pytest.approx(358 / 70)
    # (1, 2): clients 2, 3: (10 * 4.5 + 40 * 5.5) / 50
    assert gaps[(1, 2)] == pytest.approx(265 / 50)
    assert closest_pair(state.omega, state.extra[CLUSTER_SCORES], sizes, state.seen, state.active) == (
        pytest.approx(9 / 40),
        0,
        1,
    )


def test_the_smaller_cluster_retires_into_the_larger_when_the_gap_is_under_the_threshold():
    state, sizes = _state()
    assert ClusterMerging(threshold=0.2).actions(view_at(state, 5, sizes)) == []  # 0.225 is not below 0.2
    assert ClusterMerging(threshold=0.3, after=6).actions(view_at(state, 5, sizes)) == []  # not yet
    merge, note = ClusterMerging(threshold=0.3, after=5).actions(view_at(state, 5, sizes))
    assert isinstance(merge, MergeClusters) and isinstance(note, Note)
    # shares: cluster 0 (10·0.8 + 20·0.7 + 10·0.2) / 80 = 0.3 > cluster 1 (1 + 4 + 7 + 4) / 80 = 0.2
    assert (merge.source, merge.target) == (1, 0)
    before = state.omega.clone()
    merge.apply(type("Target", (), {"client_state": state})())
    assert state.active.tolist() == [True, False, True]
    assert_close(state.omega[:, 0], before[:, 0] + before[:, 1])
    assert_close(state.omega[:, 1], torch.zeros(4, dtype=F64))
    # main's MergeClusters moves the label sums with ω (tested with the action itself).
    assert_close(state.label_sums[:, 0, 0], (before[:, 0] + before[:, 1]) * 10)
    with pytest.raises(ValueError, match="both must be alive and different"):
        state.merge_clusters(1, 0)


def test_a_pair_needs_a_member_on_each_side():
    state, sizes = _state()
    state.omega[2] = torch.tensor([0.6, 0.3, 0.1], dtype=F64)  # nobody's largest ω is cluster 1 now
    gaps = pair_gaps(state.omega, state.extra[CLUSTER_SCORES], sizes, state.seen, state.active)
    assert set(gaps) == {(0, 2)}


def test_a_client_reports_its_mean_e_step_score_per_cluster():
    losses = torch.tensor([[0.5, 2.0], [1.0, 0.1], [0.3, 0.3]], dtype=F64)
    labels = torch.tensor([0, 1, 1])
    log_c = torch.tensor([[-0.5, -1.0], [-0.2, -0.1]], dtype=F64)
    # rows: [-0.5 + 0.5, -2.0 + 1.0], [-1.0 + 0.2, -0.1 + 0.1], [-0.3 + 0.2, -0.3 + 0.1]
    assert_close(client_scores(losses, labels, log_c), torch.tensor([-0.9 / 3, -1.2 / 3], dtype=F64))
    assert_close(client_scores(losses, labels, None), -losses.mean(0))
    rule = FedRC(2, merge_threshold=0.5)
    assert [(e.name, e.reported) for e in rule.state_entries()] == [(CLUSTER_SCORES, True)]
    extra = {name: value[0] for name, value in store(rule, 1).extra.items()}
    context = ClientContext(
        client=0,
        round_index=0,
        num_samples=3,
        num_classes=2,
        omega=torch.full((2,), 0.5, dtype=F64),
        active=torch.ones(2, dtype=torch.bool),
        extra=extra,
    )
    rule.e_step_many(losses, labels, torch.tensor([0, 3]), [context], log_c)
    assert_close(extra[CLUSTER_SCORES], client_scores(losses, labels, log_c))


def test_options_are_checked():
    with pytest.raises(ValueError, match="merge_threshold must be > 0"):
        ClusterMerging(threshold=0.0)
    with pytest.raises(ValueError, match="merge_after must be a number of rounds"):
        ClusterMerging(threshold=1.0, after=-1)
    with pytest.raises(ValueError, match="cannot be combined with adam_gamma"):
        FedRC(3, merge_threshold=1.0, adam_gamma=True)
    with pytest.raises(ValueError, match=r"merge_after must be a number of rounds >= 0, got -3"):
        FedRC(3, merge_after=-3)


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_a_fit_merges_one_pair_per_round_from_merge_after_on(executor):
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        5,
        clients_per_round=None,
        local_steps=1,
        config=FedRC.Config(group_round=1, merge_threshold=100.0, merge_after=1),
        executor=executor,
    )  # fmt: skip
    trainer = make_trainer(strategy, max_epochs=3)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0))
    state = trainer.lightning_module.client_state
    # Round 0: grouping into 5; rounds 1 and 2: one merge each.
    assert int(state.active.sum()) == 3
    assert_close(state.omega.sum(1), torch.ones(9, dtype=F64))
    assert bool((state.omega[:, ~state.active] == 0).all())
