"""algorithms/discovery/release.py: the early release from the grouping's hold against hand computations
(the margin, the streak of held rounds in a row, the release and its flag), its wiring into FedRC's
server step and options, and through a fit: released clients move while the held keep their ω
(resume and loop = vectorised with releases: ``test_grouping.py``'s ``RELEASING`` cases)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import MergeClusters, Note, SetState
from lightning_fedcluster.algorithms.discovery.grouping import GROUPED, HELD, LATE, RELEASED, ConceptGrouping
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES, DiscoveryView
from lightning_fedcluster.algorithms.discovery.release import STREAK, HoldRelease, release_margins
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView
from tests.algorithms.discovery.test_grouping import RELEASING, ROBUST, _grouped_fit
from tests.helpers.algorithms import server_view, store, t

F64 = torch.float64


def test_the_margin_is_the_best_other_target_cluster_minus_the_own():
    scores = t([[-1.0, -0.5, -3.0], [-2.2, -2.5, -0.2], [-1.0, -2.0, -0.4]])
    omega = t([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    alive = torch.tensor([True, True, False])
    # Client 0: own 0 (−1.0), best other −0.5. Client 1: own 1 (−2.5); cluster 2 (−0.2) is dead, so
    # the best other is cluster 0 (−2.2). Client 2's largest ω is on the dead cluster 2: its own is
    # the alive cluster of largest ω, 0 (a tie of 0.1 with cluster 1 goes to the first), other −2.0.
    assert_close(release_margins(scores, omega, alive, alive), t([0.5, 0.3, -1.0]))
    # Only cluster 0 a target (cluster 1 alive but no client's): clients 0 and 2 have no other.
    margins = release_margins(scores, omega, alive, torch.tensor([True, False, False]))
    assert margins[1] == pytest.approx(0.3) and margins[[0, 2]].tolist() == [-math.inf] * 2
    # One alive cluster: no other cluster, never released.
    alone = torch.tensor([True, False, False])
    assert release_margins(scores, omega, alone, alone).tolist() == [-math.inf] * 3


def _state(flags, scores, omega, streak=None):
    rule = FedRC(3, group_round=2, group_hold=4, group_release=0.25, group_release_rounds=2)
    state = store(rule, len(flags))
    state.extra[HELD] = t(flags)
    state.extra[CLUSTER_SCORES] = t(scores)
    state.omega = t(omega)
    state.seen[:] = True
    if streak is not None:
        state.extra[STREAK] = t(streak)
    return rule, state


# Clients 0 and 1 own cluster 0, clients 2 and 3 cluster 1; cluster 2 is alive but nobody's (a
# spare), so its scores never count, however high. Margins: client 0's 0.5 (cluster 1's −0.5
# against −1.0); client 1's −0.1 (not 6.0 by the spare); client 2's 1.0 but it is not held; client
# 3's 0.5, but it does not report in the first round.
SCORES = [[-1.0, -0.5, 0.0], [-1.0, -1.1, 5.0], [-1.0, -2.0, -2.0], [-0.5, -1.0, -2.0]]
OMEGA = [[0.8, 0.1, 0.1], [0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.8, 0.1]]
GROUPING = ConceptGrouping(group_round=2, hold=4)
RELEASE = HoldRelease(GROUPING, margin=0.25, rounds=2)


def _outcome(round_index, clients):
    clients = torch.tensor(clients)
    return RoundOutcome(round_index, clients, t(OMEGA)[clients], torch.ones(len(clients)), torch.ones(4))


def _view(state, round_index, clients) -> DiscoveryView:
    return DiscoveryView(ServerView(_outcome(round_index, clients), state, []))


def test_a_streak_counts_held_rounds_in_a_row_and_releases_at_its_length():
    _, state = _state([GROUPED, GROUPED, 0.0, GROUPED], SCORES, OMEGA, streak=[0.0, 1.0, 0.0, 1.0])
    # Held round 2 (the first of the hold): client 0 counts one, client 1's margin −0.1 resets its
    # streak, client 2 (not held) and client 3 (no report this round) keep theirs. Nobody is released.
    (streak,) = RELEASE.actions(_view(state, 2, [0, 1, 2]))
    assert streak == SetState(STREAK, streak.value) and streak.value.tolist() == [1.0, 0.0, 0.0, 1.0]
    state.extra[STREAK] = streak.value
    # The next held round: client 0 reaches 2 in a row and is released (flag RELEASED), client 3
    # (margin 0.5, streak 1) reports this time and is released with it.
    streak, flags, note = RELEASE.actions(_view(state, 3, [0, 1, 3]))
    assert streak.value.tolist() == [2.0, 0.0, 0.0, 2.0]
    assert flags == SetState(HELD, flags.value) and flags.value.tolist() == [RELEASED, GROUPED, 0.0, RELEASED]
    assert isinstance(note, Note) and "released clients [0, 3]" in note.text
    # After the hold (rounds 2-5 held) nothing is counted: no action at all.
    assert RELEASE.actions(_view(state, 6, [0, 1, 2, 3])) == []


def test_with_every_client_in_one_cluster_nobody_is_released():
    # One concept: every client owns cluster 0, and the spares score far higher: no margin at all.
    _, state = _state([GROUPED] * 4, [[-3.0, 2.0, 2.0]] * 4, [[0.8, 0.1, 0.1]] * 4, streak=[1.0] * 4)
    (streak,) = RELEASE.actions(_view(state, 3, [0, 1, 2, 3]))
    assert streak.value.tolist() == [0.0] * 4


def test_the_late_pass_s_clients_count_in_their_own_held_rounds():
    grouping = ConceptGrouping(group_round=2, margin=0.7, hold=2, late_round=4)
    _, state = _state([GROUPED, LATE, 0.0, 0.0], SCORES, OMEGA)
    # Round 4: the first pass's hold (rounds 2, 3) is over, the late pass's (4, 5) runs.
    (streak,) = replace(RELEASE, grouping=grouping).actions(_view(state, 4, [0, 1]))
    assert streak.value.tolist() == [0.0, 0.0, 0.0, 0.0]  # client 1 held, its margin −0.1: reset
    state.extra[CLUSTER_SCORES][1] = t([-1.0, -0.2, 5.0])  # now cluster 1 beats its own by 0.8
    (streak,) = replace(RELEASE, grouping=grouping).actions(_view(state, 4, [0, 1]))
    assert streak.value.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_a_released_client_is_not_held_and_the_late_pass_leaves_it_placed():
    rule = ConceptGrouping(group_round=2, margin=0.7, hold=4, late_round=3)
    assert rule.hold_weight(3, {HELD: t(GROUPED)}) == 1.0
    assert rule.hold_weight(3, {HELD: t(RELEASED)}) is None
    assert rule.hold_weight(3, {HELD: t(LATE)}) == 1.0


def test_fedrc_releases_beside_its_k_decision_and_not_in_a_grouping_round():
    rule = FedRC(
        3, group_round=2, group_hold=4, group_release=0.25, group_release_rounds=1, merge_threshold=100.0
    )
    assert [e.name for e in rule.state_entries()][-2:] == [STREAK, CLUSTER_SCORES]
    state = store(rule, 4)
    state.extra[HELD] = t([GROUPED, GROUPED, 0.0, GROUPED])
    state.extra[CLUSTER_SCORES] = t(SCORES)
    state.omega = t(OMEGA)
    state.seen[:] = True
    actions = rule.after_round(server_view(state, _outcome(3, [0, 1, 2, 3])))
    kinds = [type(a) for a in actions]
    # The release comes first (streaks; clients 0 and 3, margins 0.5, released; client 1's margin is
    # −0.1, client 2 is not held), then the round's one K decision (a merge of clusters 0 and 1).
    assert kinds == [SetState, SetState, Note, MergeClusters, Note]
    assert actions[1].value.tolist() == [RELEASED, GROUPED, 0.0, RELEASED]
    # In the grouping's round (after round 1) only the grouping acts.
    grouping_round = rule.after_round(server_view(state, _outcome(1, [0, 1, 2, 3])))
    assert all(not (isinstance(a, SetState) and a.name == STREAK) for a in grouping_round)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group_round": 2, "group_release": 0.25}, "group_release=0.25 has no effect without group_hold"),
        ({"group_round": 2, "group_hold": 3, "group_release_rounds": 2}, "without group_release"),
        ({"group_round": 2, "group_hold": 3, "group_release": -0.1}, "group_release must be >= 0"),
        ({"group_round": 2, "group_hold": 3, "group_release": True}, "group_release must be >= 0"),
        (
            {"group_round": 2, "group_hold": 3, "group_release": 0.2, "group_release_rounds": 0},
            "group_release_rounds must be a positive integer",
        ),
    ],
)
def test_release_options_out_of_range_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        FedRC(3, **options)


# --- through a fit -------------------------------------------------------------------------------------


def test_released_clients_move_while_the_held_keep_their_grouped_omega():
    state = _grouped_fit(5, grouping=RELEASING).lightning_module.client_state
    flags = state.extra[HELD]
    released, held = flags == RELEASED, flags == GROUPED
    assert bool(released.any()) and bool(held.any())
    # Held rounds 3-5 (indices 2-4): the held keep exactly the grouped 0.8; the released moved.
    assert_close(state.omega[held].max(1).values, torch.full((int(held.sum()),), 0.8, dtype=F64))
    assert not bool((state.omega[released].max(1).values == 0.8).all())
    # Without the release the same fit holds every grouped client to the end of the hold.
    plain = _grouped_fit(5, grouping={**ROBUST, "group_hold": 3}).lightning_module.client_state
    assert bool((plain.extra[HELD] == GROUPED)[released | held].all())


def test_a_release_needs_its_grouping_with_a_hold_before_it_among_the_rule_s_components():
    grouping = ConceptGrouping(group_round=2, hold=4)
    release = HoldRelease(grouping, margin=0.25)
    assert FedRC(3, components=(grouping, release)).components == (grouping, release)
    for components in ((release,), (release, grouping)):
        with pytest.raises(ValueError, match="needs its concept grouping among the rule.s components"):
            FedRC(3, components=components)
    with pytest.raises(ValueError, match="give a ConceptGrouping with hold > 0"):
        HoldRelease(ConceptGrouping(group_round=2), margin=0.25)
    options = {"group_round": 2, "group_hold": 4, "group_release": 0.25, "group_release_rounds": 3}
    assert FedRC(3, **options).components == (grouping, HoldRelease(grouping, 0.25, 3))
