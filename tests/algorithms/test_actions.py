"""algorithms/actions.py: every action on a hand-built server state; an action that replaces a
cluster's model (``ReplaceModel``) always restarts that cluster's server-optimizer state; a merge
moves the removed cluster's mass."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.algorithms.actions import (
    CopyCluster,
    MergeClusters,
    Note,
    Reassign,
    RemoveClusters,
    ReplaceModel,
    SetCentre,
    SetState,
    SplitCluster,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry


class Target:
    """An action target: three clients, three clusters of two tensors each (cluster k holds k)."""

    def __init__(self) -> None:
        self.client_state = ClientState.initial(3, 2, 3)
        self.client_state.extra["flag"] = torch.tensor(0.0)
        self.global_clusters = [[torch.full((2,), float(k)), torch.full((1, 2), float(k))] for k in range(3)]
        self.replaced: list[int] = []
        self.lines: list[str] = []

    def model_replaced(self, cluster: int) -> None:
        self.replaced.append(cluster)

    def say(self, text: str) -> None:
        self.lines.append(text)


def test_set_centre_writes_the_vector_and_restarts_the_server_optimizer_state():
    target = Target()
    SetCentre(1, torch.tensor([5.0, 6.0, 7.0, 8.0])).apply(target)
    assert target.global_clusters[1][0].tolist() == [5.0, 6.0]
    assert target.global_clusters[1][1].tolist() == [[7.0, 8.0]]
    assert target.replaced == [1]  # a momentum of the old model must not move the new centre


def test_copy_and_split_replace_their_target_model():
    target = Target()
    CopyCluster(2, 0).apply(target)
    assert target.global_clusters[2][0].tolist() == [0.0, 0.0] and target.replaced == [2]
    assert bool(target.client_state.active[2])
    SplitCluster(1, 0, torch.tensor([0, 2]), torch.tensor([0.5, 1.0], dtype=torch.float64)).apply(target)
    assert target.global_clusters[1][1].tolist() == [[0.0, 0.0]] and target.replaced == [2, 1]
    # ω on cluster 0 (1/3) moves to cluster 1: half of client 0's, all of client 2's.
    omega = target.client_state.omega
    torch.testing.assert_close(omega[0], torch.tensor([1 / 6, 1 / 2, 1 / 3], dtype=torch.float64))
    torch.testing.assert_close(omega[2], torch.tensor([0.0, 2 / 3, 1 / 3], dtype=torch.float64))


def test_actions_that_keep_the_models_restart_no_server_state():
    target = Target()
    Reassign(torch.tensor([1]), torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)).apply(target)
    SetState("flag", torch.tensor(1.0)).apply(target)
    RemoveClusters(torch.tensor([True, False, False])).apply(target)
    Note("hello").apply(target)
    assert target.replaced == [] and target.lines == ["hello"]
    assert target.client_state.omega[1].tolist() == [0.0, 0.0, 1.0]
    assert float(target.client_state.extra["flag"]) == 1.0
    assert target.client_state.active.tolist() == [False, True, True]
    with pytest.raises(KeyError, match="state_entries"):
        SetState("unknown", torch.tensor(1.0)).apply(target)


def test_a_model_replacement_cannot_skip_the_restart():
    with pytest.raises(TypeError, match="overrides apply"):

        class Sneaky(ReplaceModel):  # noqa: F841 - defining it is the test
            def apply(self, target):
                pass


def test_merge_moves_the_removed_clusters_mass_and_keeps_the_models():
    target = Target()
    state = target.client_state
    state.omega[0] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    state.label_sums[0, 1] = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    action = MergeClusters(target=0, source=2)
    assert action.rewrites == ("omega", "label_sums")
    action.apply(target)
    assert state.active.tolist() == [True, True, False]
    torch.testing.assert_close(state.omega[0], torch.tensor([0.7, 0.3, 0.0], dtype=torch.float64))
    torch.testing.assert_close(state.omega[1], torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))
    assert state.label_sums[0, 1].tolist() == [5.0, 2.0, 0.0]
    assert target.global_clusters[0][0].tolist() == [0.0, 0.0] and target.replaced == []
    with pytest.raises(ValueError, match="both must be alive"):
        MergeClusters(target=0, source=2).apply(target)


def test_merge_moves_the_declared_per_sample_mixtures_it_names():
    state = ClientState.initial(1, 2, 3, (StateEntry("gamma", Scope.SAMPLE, (3,), mixture=True),), 2)
    state.extra["gamma"] = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], dtype=torch.float64)
    with pytest.raises(ValueError, match="mixtures=\\('gamma',\\)"):
        state.merge_clusters(2, 1)
    state.merge_clusters(2, 1, ("gamma",))
    torch.testing.assert_close(
        state.extra["gamma"], torch.tensor([[0.6, 0.4, 0.0], [0.2, 0.8, 0.0]], dtype=torch.float64)
    )
