"""discovery/signature_trigger.py: the grouping fires when the signatures separate and stay put."""

from __future__ import annotations

import torch

from lightning_fedcluster.algorithms.actions import Note, Reassign, RemoveClusters, SetState
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.placement import PLACED, Placement
from lightning_fedcluster.algorithms.discovery.protocol import DiscoveryView
from lightning_fedcluster.algorithms.discovery.signature_trigger import (
    DONE,
    GAVE_UP,
    GROUP,
    ROUNDS_STABLE,
    SIGNATURE,
    SIGNATURE_ROWS,
    STABLE_STREAK,
    SignatureGrouping,
)
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView
from tests.helpers.algorithms import t

# Two relabelling concepts over three classes: clients 0-3 predict each label as itself, clients
# 4-5 labels 0 and 1 swapped (distance 1.5 on labels 0 and 1, 0 on label 2: 1.0 between the two).
SAME = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]
SWAPPED = [[0.1, 0.8, 0.1], [0.8, 0.1, 0.1], [0.1, 0.1, 0.8]]


def _state(signatures) -> ClientState:
    classes = len(signatures[0])
    entries = SignatureGrouping(0.2).state_entries(3) + Placement().state_entries(3)
    state = ClientState.initial(6, classes, 3, entries)
    state.seen[:] = True
    state.extra[SIGNATURE] = t(signatures)
    state.extra[SIGNATURE_ROWS] = t([[10.0] * classes] * 6)
    return state


def _run(state: ClientState, round_index: int, num_rounds: int | None = 60):
    outcome = RoundOutcome(round_index, torch.arange(6), state.omega.clone(), torch.ones(6), torch.ones(6))
    view = DiscoveryView(ServerView(outcome, state, [[torch.zeros(1)]] * 3), num_rounds=num_rounds)
    actions = SignatureGrouping(0.2).actions(view)
    for action in actions:  # what the store would do with the bookkeeping
        if isinstance(action, SetState):
            state.extra[action.name] = action.value.clone()
    return actions


def test_separated_signatures_group_after_staying_put_and_retire_the_spare_cluster():
    state = _state([SAME] * 4 + [SWAPPED] * 2)
    for round_index in range(ROUNDS_STABLE):
        actions = _run(state, round_index)
        assert not any(isinstance(a, Reassign) for a in actions)
        assert float(state.extra[STABLE_STREAK][0]) == round_index  # the first round sets the reference
    assert state.extra[GROUP].tolist() == [0.0] * 4 + [1.0] * 2
    actions = _run(state, ROUNDS_STABLE)
    reassign = next(a for a in actions if isinstance(a, Reassign))
    assert reassign.clients.tolist() == list(range(6))
    clusters = reassign.omega.argmax(1).tolist()
    assert len(set(clusters[:4])) == 1 and len(set(clusters[4:])) == 1 and clusters[0] != clusters[4]
    assert state.extra[PLACED].tolist() == [float(c) for c in clusters]
    removed = next(a for a in actions if isinstance(a, RemoveClusters))
    assert removed.mask.nonzero().flatten().tolist() == [3 - clusters[0] - clusters[4]]
    assert bool((state.extra[DONE] == 1).all())
    assert "2 groups of [4, 2] clients" in next(a.text for a in actions if isinstance(a, Note))
    assert _run(state, ROUNDS_STABLE + 1) == []  # fired once: nothing more


def test_signatures_that_do_not_separate_never_group_and_it_gives_up_at_a_third_of_the_run():
    # rule concepts: every client predicts each label as itself (one group, silhouette 0)
    state = _state([SAME] * 6)
    for round_index in range(9):
        assert not any(isinstance(a, Reassign) for a in _run(state, round_index, num_rounds=30))
    actions = _run(state, 9, num_rounds=30)  # rounds 1-10 are the first third of 30
    assert bool((state.extra[DONE] == GAVE_UP).all())
    assert "gave up" in next(a.text for a in actions if isinstance(a, Note))


def test_a_group_under_the_share_of_the_rows_gets_no_cluster():
    state = _state([SAME] * 5 + [SWAPPED])  # the swapped client holds 1/6 < 0.2 of the rows
    for round_index in range(ROUNDS_STABLE + 1):
        actions = _run(state, round_index)
    reassign = next(a for a in actions if isinstance(a, Reassign))
    assert reassign.clients.tolist() == [0, 1, 2, 3, 4]
    assert state.extra[PLACED].tolist()[5] == -1.0
    assert not any(isinstance(a, RemoveClusters) for a in actions)  # one group: nothing retires


def test_with_two_classes_the_grouping_is_off_from_the_first_round():
    state = _state([[[0.9, 0.1], [0.2, 0.8]]] * 4 + [[[0.1, 0.9], [0.8, 0.2]]] * 2)
    actions = _run(state, 0)
    assert bool((state.extra[DONE] == GAVE_UP).all())
    assert "carries only a sign" in next(a.text for a in actions if isinstance(a, Note))
