"""discovery/protocol.py: the component defaults, the view's shortcuts, and the scores and shares
the components read, against hand computations."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    ClientTurn,
    Component,
    DiscoveryView,
    client_scores,
    cluster_shares,
    scores_entry,
)
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView
from tests.helpers.algorithms import ctx, t


class Bare(Component):
    """A component that overrides nothing."""


def test_a_component_that_overrides_nothing_changes_nothing():
    bare = Bare()
    assert (bare.decisive, bare.wants_outputs, bare.wants_scores) == (False, False, False)
    assert bare.state_entries(3) == ()
    turn = ClientTurn(
        report=None, losses=torch.zeros(2, 2), labels=torch.zeros(2, dtype=torch.long),
        log_label_stats=None, context=ctx([0.5, 0.5]),
    )  # fmt: skip
    assert bare.client(turn) is turn
    assert bare.actions(None) == []
    assert bare.check(object()) is None


def test_the_view_reads_the_round_the_outcome_and_the_store_of_its_server():
    state = ClientState.initial(3, 2, 2, ())
    outcome = RoundOutcome(7, torch.tensor([0, 2]), state.omega[[0, 2]].clone(), torch.ones(2), torch.ones(3))
    view = DiscoveryView(ServerView(outcome, state, []), num_rounds=40)
    assert view.round_index == 7 and view.outcome is outcome and view.num_rounds == 40
    assert_close(view.state.omega, state.omega)
    assert DiscoveryView(ServerView(outcome, state, [])).num_rounds is None


def test_the_scores_entry_is_a_reported_per_client_row_of_k():
    entry = scores_entry(4)
    assert (entry.name, entry.scope, tuple(entry.shape)) == (CLUSTER_SCORES, Scope.CLIENT, (4,))
    assert entry.reported


def test_a_client_s_score_per_cluster_is_its_mean_minus_loss_minus_log_c():
    # two samples (labels 0 and 1), two clusters; C_{y,k}: cluster 0 (0.5, 0.5), cluster 1 (0.25, 0.75)
    losses = t([[0.2, 0.4], [0.6, 1.0]])
    labels = torch.tensor([0, 1])
    log_c = t([[math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.75)]])
    expected_0 = (-0.2 - math.log(0.5) - 0.6 - math.log(0.5)) / 2
    expected_1 = (-0.4 - math.log(0.25) - 1.0 - math.log(0.75)) / 2
    assert_close(client_scores(losses, labels, log_c), t([expected_0, expected_1]))
    assert_close(client_scores(losses, labels, None), t([-0.4, -0.7]))  # FedEM: no C_y


def test_cluster_shares_weigh_each_seen_client_s_omega_by_its_rows():
    omega = t([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    sizes = torch.tensor([30, 10, 60])
    seen = torch.tensor([True, True, False])  # the third has never reported: it does not count
    assert_close(cluster_shares(omega, sizes, seen), t([35 / 40, 5 / 40]))
