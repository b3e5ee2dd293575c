"""discovery/settled_events.py: one K event a round, once the assignments have settled."""

from __future__ import annotations

import torch

from lightning_fedcluster.algorithms.actions import MergeClusters, Note, RemoveClusters
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.placement import PLACED, PLACED_AT, Placement
from lightning_fedcluster.algorithms.discovery.protocol import ClientTurn, DiscoveryView
from lightning_fedcluster.algorithms.discovery.settled_events import (
    FITS,
    FITS_BEFORE,
    FITS_TURNS,
    SettledEvents,
    settled,
)
from lightning_fedcluster.algorithms.discovery.signature_trigger import DONE, SignatureGrouping
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView
from tests.helpers.algorithms import ctx, t

# Clients 0-3 (10 rows each) own cluster 0, 1, 1, 2; cluster 3 holds 2 % of the rows. Clusters 0
# and 1 fit their members alike (gap (0.05 * 3) / 3 = 0.05), as at the members' participations
# before; cluster 2 is far from both. Fits are mean −loss per cluster.
OMEGA = [[0.97, 0.0, 0.0, 0.03], [0.0, 0.97, 0.0, 0.03], [0.0, 0.99, 0.0, 0.01], [0.0, 0.0, 1.0, 0.0]]
SCORES = [[-1.0, -1.05, -4.0, -5.0], [-1.05, -1.0, -4.0, -5.0], [-1.05, -1.0, -4.0, -5.0],
          [-4.0, -4.0, -1.0, -5.0]]  # fmt: skip


def _view(
    round_index: int,
    *,
    done: float = 2.0,
    moved_at: float = 1.0,
    num_rounds: int | None = 30,
    fits_before: list[list[float]] | None = None,
    fits: list[list[float]] = SCORES,
    omega: list[list[float]] = OMEGA,
):
    entries = (
        SignatureGrouping(0.05).state_entries(4)
        + Placement().state_entries(4)
        + SettledEvents(0.1, 0.05).state_entries(4)
    )
    state = ClientState.initial(4, 2, 4, entries)
    state.seen[:] = True
    state.omega = t(omega)
    state.extra[FITS] = t(fits)
    state.extra[FITS_BEFORE] = t(fits if fits_before is None else fits_before)
    state.extra[FITS_TURNS][:] = 2.0
    state.extra[DONE][:] = done
    state.extra[PLACED] = t([0.0, 1.0, 1.0, 2.0])
    state.extra[PLACED_AT][:] = moved_at
    outcome = RoundOutcome(
        round_index, torch.arange(4), state.omega.clone(), torch.ones(4), torch.full((4,), 10)
    )
    return DiscoveryView(ServerView(outcome, state, [[torch.zeros(1)]] * 4), num_rounds=num_rounds)


def test_no_event_before_a_third_of_the_run_while_the_grouping_watches_or_while_clients_move():
    assert settled(_view(8))[0] is False  # round 9 of 30
    assert settled(_view(9))[0] is True  # round 10 of 30
    assert settled(_view(20, done=0.0))[0] is False
    ok, why = settled(_view(20, moved_at=20.0))  # all four placed in the last three rounds
    assert ok is False and "100%" in why
    assert SettledEvents(gap=0.1, min_share=0.05).actions(_view(8)) == []


def test_the_pair_within_the_gap_merges_first_the_smaller_into_the_larger():
    merge, note = SettledEvents(gap=0.1, min_share=0.05).actions(_view(20))
    assert isinstance(merge, MergeClusters) and (merge.target, merge.source) == (1, 0)
    assert isinstance(note, Note) and "0.050 nats" in note.text and "below 0.1 and not growing" in note.text


def _fits(pair: float, third: float) -> list[list[float]]:
    # clients 0-2 (clusters 0, 1, 1): clusters 0 and 1 fit them `pair` apart; client 3 (cluster 2)
    # and clusters 0/1 are `third` apart both ways, so the nearest third cluster is `third` away
    a, b, c = -1.0, -1.0 - pair, -1.0 - third
    return [[a, b, c, -5.0], [b, a, c, -5.0], [b, a, c, -5.0], [c, c, a, -5.0]]


# Four clusters of one client each; clusters 0 and 1 fit clients 0 and 1 `pair` apart, clusters 2 and
# 3 are `third` from them and 2 · `third` from each other: two references for the relative test.
FOUR = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]


def _four(pair: float, third: float) -> list[list[float]]:
    a, b, c, far = -1.0, -1.0 - pair, -1.0 - third, -1.0 - 2 * third
    return [[a, b, c, c], [b, a, c, c], [c, c, a, far], [c, c, far, a]]


def test_a_pair_under_a_third_of_its_gap_to_a_specialised_third_cluster_merges_whatever_its_scale():
    # 0.5 nats apart, 3 nats from clusters 2 and 3: far above gap = 0.1, but 0.5 < 3 / 3
    view = _view(20, fits=_four(0.5, 3.0), omega=FOUR)
    merge, note = SettledEvents(gap=0.1, min_share=0.05).actions(view)
    assert isinstance(merge, MergeClusters) and {merge.target, merge.source} == {0, 1}
    assert (
        "within 0.500 nats per sample, below a third of the 3.000 to the nearest other cluster" in note.text
    )


def test_the_relative_test_needs_a_third_under_its_share_two_references_and_specialised_ones():
    events = SettledEvents(gap=0.1, min_share=0.05)
    # 1.2 of 3 nats: more than a third (no cluster is under min_share: nothing happens)
    assert events.actions(_view(20, fits=_four(1.2, 3.0), omega=FOUR)) == []
    # 0.15 of 0.6: a quarter, but clusters 0.6 nats away (< ln 2) have not specialised
    assert events.actions(_view(20, fits=_four(0.15, 0.6), omega=FOUR)) == []
    # growing since the members' participations before: not merged
    grown = _view(20, fits=_four(0.5, 3.0), fits_before=_four(0.4, 3.0), omega=FOUR)
    assert events.actions(grown) == []
    # one other cluster with members (cluster 3 holds no client): one comparison does not decide;
    # the removal of cluster 3 (1.75 %) instead
    assert isinstance(events.actions(_view(20, fits=_fits(0.5, 3.0)))[0], RemoveClusters)


def test_a_pair_whose_gap_grew_since_the_members_last_took_part_does_not_merge():
    # before: clusters 0 and 1 at 0.02 apart for their members (now 0.05): separating, not one concept
    before = [[-1.0, -1.02, -4.0, -5.0], [-1.02, -1.0, -4.0, -5.0], [-1.02, -1.0, -4.0, -5.0],
              [-4.0, -4.0, -1.0, -5.0]]  # fmt: skip
    remove, _ = SettledEvents(gap=0.1, min_share=0.05).actions(_view(20, fits_before=before))
    assert isinstance(remove, RemoveClusters)  # the removal instead: cluster 3's 1.75 %


def test_a_client_records_its_mean_minus_loss_per_cluster_and_keeps_the_one_before():
    events = SettledEvents(gap=0.1, min_share=0.05)
    context = ctx([0.5, 0.5], num_samples=2)
    context.extra.update({FITS: t([-0.7, -0.9]), FITS_BEFORE: t([0.0, 0.0]), FITS_TURNS: t(1.0)})
    losses = t([[0.2, 0.4], [0.6, 1.0]])
    turn = ClientTurn(None, losses, torch.tensor([0, 1]), None, context)
    assert events.client(turn) is turn
    assert torch.equal(context.extra[FITS], t([-0.4, -0.7]))
    assert torch.equal(context.extra[FITS_BEFORE], t([-0.7, -0.9]))
    assert float(context.extra[FITS_TURNS]) == 2.0


def test_without_a_pair_to_merge_the_smallest_cluster_under_the_share_is_removed_alone():
    far = _fits(1.2, 3.0)  # the closest pair is 1.2 nats apart: over gap and over a third of 3
    remove, note = SettledEvents(gap=0.04, min_share=0.05).actions(_view(20, fits=far))
    assert isinstance(remove, RemoveClusters) and remove.mask.tolist() == [False, False, False, True]
    # (0.03 + 0.03 + 0.01) / 4 = 1.75 %, rounded in binary below it
    assert "removed cluster 3 (it explains 1.7% of the rows, below 5%" in note.text
    assert SettledEvents(gap=0.04, min_share=0.01).actions(_view(20, fits=far)) == []


def test_an_unbounded_run_waits_for_every_client_to_take_part_three_times():
    assert settled(_view(1, num_rounds=None))[0] is False
    assert settled(_view(5, num_rounds=None))[0] is True  # 3 rounds x 4 of 4 clients, quiet since
