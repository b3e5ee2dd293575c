"""algorithms/discovery/removal.py: adaptive K by removal (FedRC App. F) against hand computations
(the shares, the last cluster kept, the store's renormalisation), when it acts (``removal_after``),
its checks, and the component on its own."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import RemoveClusters
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.removal import ClusterRemoval, clusters_to_remove
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from tests.helpers.algorithms import F64, TIGHT, server_view, t, view_at


def test_cluster_removal_by_hand_and_state_renormalisation():
    omega = t([[0.9, 0.08, 0.02], [0.5, 0.45, 0.05], [0.0, 0.0, 1.0]])
    sizes = torch.tensor([10, 30, 1000])
    seen = torch.tensor([True, True, False])  # the unseen client does not count
    # shares: (10·[.9,.08,.02] + 30·[.5,.45,.05]) / 40 = [0.6, 0.3575, 0.0425]
    remove = clusters_to_remove(omega, sizes, seen, torch.ones(3, dtype=torch.bool), 0.05)
    assert remove.tolist() == [False, False, True]
    state = ClientState(omega=omega.clone(), label_sums=torch.ones(3, 2, 3, dtype=F64), seen=seen)
    state.remove_clusters(remove)
    assert state.active.tolist() == [True, True, False]
    assert_close(state.omega[0], t([0.9 / 0.98, 0.08 / 0.98, 0.0]), **TIGHT)
    assert_close(state.omega[2], t([0.5, 0.5, 0.0]), **TIGHT)  # all its mass was removed: uniform
    assert torch.equal(state.label_sums[..., 2], torch.zeros(3, 2, dtype=F64))
    # The last cluster standing is never removed, even below the threshold.
    survivors = clusters_to_remove(
        t([[0.5, 0.5, 0.0]]), torch.tensor([1]), torch.tensor([True]), torch.tensor([True, True, False]), 0.9
    )
    assert survivors.tolist() == [False, True, False]  # cluster 0 (the tie's lowest index) stays
    with pytest.raises(ValueError, match="at least one"):
        state.remove_clusters(torch.ones(3, dtype=torch.bool))


def test_removal_waits_for_removal_after_then_removes_as_by_hand():
    # the shares of the test above: [0.6, 0.3575, 0.0425]; δ = 0.05 removes cluster 2
    omega = t([[0.9, 0.08, 0.02], [0.5, 0.45, 0.05], [0.0, 0.0, 1.0]])
    seen = torch.tensor([True, True, False])
    rule = FedRC(3, removal_threshold=0.05, removal_after=5)

    def decide(round_index: int) -> list:
        state = ClientState(omega=omega.clone(), label_sums=torch.ones(3, 2, 3, dtype=F64), seen=seen)
        sizes = torch.tensor([10, 30, 1000])
        outcome = RoundOutcome(round_index, torch.tensor([0, 1]), omega[:2], sizes[:2], sizes)
        return rule.after_round(server_view(state, outcome))

    assert decide(4) == []  # round index 4 < removal_after: no removal, although cluster 2 is below δ
    removal, note = decide(5)
    assert removal.mask.tolist() == [False, False, True]
    assert "removed cluster(s) [2]" in note.text and "2 remain" in note.text
    assert FedRC(3, removal_threshold=0.05).config.removal_after == 0  # the paper's: from the first round


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"removal_after": 3}, "removal_after=3 has no effect without removal_threshold"),
        ({"removal_threshold": 0.1, "removal_after": -1}, "must be a number of rounds >= 0, got -1"),
        ({"removal_threshold": 0.1, "removal_after": True}, "must be a number of rounds >= 0, got True"),
        ({"removal_threshold": 0.1, "removal_after": 2.0}, "must be a number of rounds >= 0, got 2.0"),
    ],
)
def test_removal_after_is_checked(options, message):
    with pytest.raises(ValueError, match=message):
        FedRC(3, **options)


def test_the_component_decides_k_from_its_round_and_checks_its_values():
    # shares [0.6, 0.3575, 0.0425] (as above): δ = 0.05 removes cluster 2, δ = 0.4 clusters 1 and 2
    state = ClientState(
        omega=t([[0.9, 0.08, 0.02], [0.5, 0.45, 0.05], [0.0, 0.0, 1.0]]),
        label_sums=torch.ones(3, 2, 3, dtype=F64),
        seen=torch.tensor([True, True, False]),
    )
    sizes = [10, 30, 1000]
    assert ClusterRemoval.decisive
    assert ClusterRemoval(0.05, after=3).actions(view_at(state, 2, sizes)) == []
    (remove, _) = ClusterRemoval(0.4, after=3).actions(view_at(state, 3, sizes))
    assert isinstance(remove, RemoveClusters) and remove.mask.tolist() == [False, True, True]
    assert ClusterRemoval(0.01).actions(view_at(state, 0, sizes)) == []  # nobody below δ: no action
    assert FedRC(3, removal_threshold=0.05, removal_after=2).components == (ClusterRemoval(0.05, 2),)
    for bad in (0.0, 1.0, True):
        with pytest.raises(ValueError, match="removal_threshold must be in"):
            ClusterRemoval(bad)
    with pytest.raises(ValueError, match="removal_after must be a number of rounds >= 0, got -1"):
        ClusterRemoval(0.05, after=-1)
