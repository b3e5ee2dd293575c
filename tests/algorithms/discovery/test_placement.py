"""discovery/placement.py: placing clients by their relative fit, against hand computations."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import Note, SetState
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.client_turn import ClientReport
from lightning_fedcluster.algorithms.discovery.placement import (
    CANDIDATE,
    CONFIRMED,
    HOLD_TURNS,
    PLACED,
    PLACED_AT,
    PLACED_TURNS,
    STREAK,
    Placement,
    placed_report,
)
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES, ClientTurn, DiscoveryView
from lightning_fedcluster.algorithms.discovery.signals import fit_margins
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView
from tests.helpers.algorithms import ctx, t

# Four clients, two clusters. Relative to the median of each cluster's score over the four
# (cluster 0: -1.4, cluster 1: -1.6), client 0 fits cluster 0 by a margin of 0.8 nats, client 2
# cluster 1 by 1.2; clients 1 and 3 by 0.4 only (below the gap of 0.5).
SCORES = [[-1.0, -2.0], [-1.2, -1.8], [-2.0, -1.0], [-1.6, -1.4]]


def _view(
    round_index: int = 4, extra: dict[str, list[float]] | None = None
) -> tuple[DiscoveryView, ClientState]:
    placement = Placement(margin=0.5)
    state = ClientState.initial(4, 2, 2, placement.state_entries(2))
    state.seen[:] = True
    state.extra[CLUSTER_SCORES] = t(SCORES)
    for name, values in (extra or {}).items():
        state.extra[name] = t(values)
    clients = torch.arange(4)
    outcome = RoundOutcome(round_index, clients, state.omega.clone(), torch.ones(4), torch.ones(4))
    return DiscoveryView(
        ServerView(outcome, state, [[torch.zeros(1)], [torch.zeros(1)]]), num_rounds=30
    ), state


def _set(actions) -> dict[str, torch.Tensor]:
    return {a.name: a.value for a in actions if isinstance(a, SetState)}


def test_a_first_clear_fit_starts_a_streak_and_places_nobody():
    view, _ = _view()
    actions = Placement(margin=0.5).actions(view)
    values = _set(actions)
    assert values[CANDIDATE].tolist() == [0.0, -1.0, 1.0, -1.0]
    assert values[STREAK].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert values[PLACED].tolist() == [-1.0] * 4
    assert not any(isinstance(a, Note) for a in actions)


def test_the_second_participation_in_a_row_places_and_starts_the_ramp():
    view, _ = _view(extra={CANDIDATE: [0.0, 1.0, 1.0, -1.0], STREAK: [1.0, 1.0, 1.0, 0.0]})
    actions = Placement(margin=0.5).actions(view)
    values = _set(actions)
    # clients 0 and 2: the same cluster twice -> placed; client 1's fit no longer clear: streak 0
    assert values[PLACED].tolist() == [0.0, -1.0, 1.0, -1.0]
    assert values[PLACED_AT].tolist() == [5.0, -1.0, 5.0, -1.0]  # their first placed E-step: round index 5
    assert values[STREAK].tolist() == [2.0, 0.0, 2.0, 0.0]
    assert values[CONFIRMED].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert "placed 2 client(s)" in next(a.text for a in actions if isinstance(a, Note))


def test_a_grouped_client_is_held_against_its_fit_until_it_confirms_or_its_turns_run_out():
    # client 0 was placed on cluster 1 by the grouping (not confirmed); its fit says cluster 0 twice
    held = {PLACED: [1.0, -1.0, -1.0, -1.0], PLACED_AT: [3.0, -1, -1, -1], CANDIDATE: [0.0, -1, -1, -1],
            STREAK: [1.0, 0, 0, 0]}  # fmt: skip
    view, _ = _view(extra=held)
    values = _set(Placement(margin=0.5).actions(view))
    assert values[PLACED][0] == 1.0 and values[PLACED_TURNS][0] == 1.0
    view, _ = _view(extra={**held, PLACED_TURNS: [HOLD_TURNS - 1.0, 0, 0, 0]})
    values = _set(Placement(margin=0.5).actions(view))
    assert values[PLACED][0] == 0.0  # the hold ran out: it moves to its fit


def test_a_placed_client_moves_only_to_a_cluster_that_fits_it_better_in_absolute_terms():
    # client 0 is placed (confirmed) on cluster 0 and its relative fit has pointed to cluster 1
    # once before. Cluster medians: -0.65 (0) and -3.0 (1). Relative to them client 0 fits
    # cluster 1 by 2.25 nats, but its own score on cluster 1 (-1.1) is below its score on its
    # own cluster (-1.0): it stays. With -0.9 on cluster 1 it moves.
    placed = {PLACED: [0.0, -1, -1, -1], PLACED_AT: [2.0, -1, -1, -1], CONFIRMED: [1.0, 0, 0, 0],
              CANDIDATE: [1.0, -1, -1, -1], STREAK: [1.0, 0, 0, 0]}  # fmt: skip
    for own_on_one, expected in ((-1.1, 0.0), (-0.9, 1.0)):
        view, state = _view(extra=placed)
        state.extra[CLUSTER_SCORES] = t([[-1.0, own_on_one], [-0.5, -3.0], [-0.6, -3.0], [-0.7, -3.0]])
        values = _set(Placement(margin=0.5).actions(view))
        assert values[STREAK][0] == 2.0  # the relative fit pointed to cluster 1 twice in a row
        assert values[PLACED][0] == expected
    # an unplaced client with the same scores is placed by the relative fit alone
    view, state = _view(extra={CANDIDATE: [1.0, -1, -1, -1], STREAK: [1.0, 0, 0, 0]})
    state.extra[CLUSTER_SCORES] = t([[-1.0, -1.1], [-0.5, -3.0], [-0.6, -3.0], [-0.7, -3.0]])
    assert _set(Placement(margin=0.5).actions(view))[PLACED][0] == 1.0


def test_a_placed_client_counts_half_the_medians_so_it_joins_a_better_copy_not_a_stronger_concept():
    # client 0 is placed (confirmed) on cluster 0 and has pointed to cluster 1 once before.
    placed = {PLACED: [0.0, -1, -1, -1], PLACED_AT: [2.0, -1, -1, -1], CONFIRMED: [1.0, 0, 0, 0],
              CANDIDATE: [1.0, -1, -1, -1], STREAK: [1.0, 0, 0, 0]}  # fmt: skip
    # Cluster 1 is a copy of its concept that fits everyone about 0.35 nats better. Medians -1.0
    # and -0.65: relative to them client 0 fits cluster 0 (0.0 against -0.05), but with half the
    # medians cluster 1 (-0.7 + 0.325 = -0.375 against -1.0 + 0.5 = -0.5): it moves.
    copy = [[-1.0, -0.7], [-1.0, -0.6], [-1.2, -0.8], [-0.8, -0.4]]
    assert fit_margins(t(copy), torch.tensor([True, True]))[0][0] == 0
    # Cluster 1 serves another concept and fits the other clients 2.7 nats better than cluster 0:
    # client 0's own score is higher there (-0.8 > -1.0), but with half the medians (-2.95 and
    # -0.275) cluster 0 leads (0.475 against -0.6625): it stays.
    stronger = [[-1.0, -0.8], [-3.0, -0.2], [-3.0, -0.3], [-2.9, -0.25]]
    for scores, expected in ((copy, 1.0), (stronger, 0.0)):
        view, state = _view(extra=placed)
        state.extra[CLUSTER_SCORES] = t(scores)
        values = _set(Placement().actions(view))
        assert values[PLACED][0] == expected
        assert values[CANDIDATE][0] == expected


def test_a_placed_client_ramps_to_one_hot_then_trains_its_cluster_alone():
    gamma = t([[0.5, 0.5], [0.9, 0.1]])
    report = placed_report(gamma, torch.tensor([0, 1]), 1, 0.25, 2)
    assert_close(report.gamma, t([[0.375, 0.625], [0.675, 0.325]]))
    assert_close(report.omega, t([0.525, 0.475]))
    assert_close(report.label_sums, t([[0.375, 0.625], [0.675, 0.325]]))

    placement = Placement(margin=0.5)
    state = ClientState.initial(1, 2, 2, placement.state_entries(2))
    extra = {k: v[0].clone() for k, v in state.extra.items()}
    extra[PLACED], extra[PLACED_AT] = (
        torch.tensor(1.0, dtype=torch.float64),
        torch.tensor(5.0, dtype=torch.float64),
    )
    losses, labels = t([[0.2, 0.3], [0.4, 0.1]]), torch.tensor([0, 1])
    base = ClientReport(gamma=gamma, omega=gamma.mean(0), label_sums=gamma)
    for round_index, alpha, trains in ((5, 0.25, None), (7, 0.75, None), (8, 1.0, (1,))):
        context = ctx([0.5, 0.5], num_samples=2, extra=extra)
        context = type(context)(**{**context.__dict__, "round_index": round_index})
        turn = placement.client(ClientTurn(base, losses, labels, None, context))
        assert turn.train_clusters == trains
        assert_close(turn.report.gamma, placed_report(gamma, labels, 1, alpha, 2).gamma)


def test_an_unplaced_client_weighs_its_copies_by_omega_at_half_strength():
    placement = Placement(margin=0.5)
    state = ClientState.initial(1, 2, 2, placement.state_entries(2))
    extra = {k: v[0].clone() for k, v in state.extra.items()}
    gamma = t([[0.8, 0.2], [0.6, 0.4]])
    base = ClientReport(gamma=gamma, omega=gamma.mean(0), label_sums=gamma)
    turn = placement.client(ClientTurn(base, t([[0.2, 0.3], [0.4, 0.1]]), torch.tensor([0, 1]), None,
                                       ctx([0.5, 0.5], num_samples=2, extra=extra)))  # fmt: skip
    assert turn.train_clusters is None and turn.report is base
    assert_close(turn.copy_weights, t([0.85, 0.65]))
    # a client placed on a cluster that a K event removed since is unplaced again
    extra[PLACED], extra[PLACED_AT] = (
        torch.tensor(1.0, dtype=torch.float64),
        torch.tensor(0.0, dtype=torch.float64),
    )
    context = ctx([0.5, 0.5], num_samples=2, extra=extra, active=[True, False])
    losses = t([[0.2, 0.3], [0.4, 0.1]])
    turn = placement.client(ClientTurn(base, losses, torch.tensor([0, 1]), None, context))
    assert turn.train_clusters is None and turn.report is base
    assert_close(turn.copy_weights, t([0.85, 0.65]))
