"""K events once the assignments have settled: merge two clusters of one concept, remove an empty one.

Starting from more clusters than concepts, some clusters end up holding the same concept (or
nobody). Deciding that early is what merged concepts and retired clusters wholesale in the
round-number recipe (``benchmarks/results/discovery_off_cells.md``): before the models have
specialised, every pair of clusters looks alike. So these events wait for three signals:

- the concept grouping has fired or given up (``signature_trigger.py``);
- the run is at least ``RUN_SHARE`` through (a fraction of the trainer's ``max_epochs``; with an
  unbounded run, every seen client has taken part ``TURNS_SEEN`` times);
- the assignments have settled: at least ``PLACED_SHARE`` of the seen clients are placed
  (``placement.py``; or two thirds of the run are done, where nothing places them, one concept
  for one) and at most ``MAX_MOVED`` of them were placed or moved in the last ``QUIET_ROUNDS``
  rounds.

Then, at most one event a round: the two clusters whose members fit both within ``gap`` nats per
sample, or within ``RELATIVE_GAP`` of the gap from either of them to the nearest third cluster,
with a gap no larger than at those members' participations before, merge (the one explaining
less of the data goes into the other), or else the alive cluster with the smallest share of the
rows is removed when that share is below ``min_share``. One at a time, each on its own evidence,
so no round removes more than it measured.

The fit is the mean −loss per cluster (``merging.py``'s gap without FedRC's label term: a merge
pools the two clusters' labels). The gap must be steady because two clusters of one concept,
each trained by its own clients, drift apart and then hold their gap (0.02–0.05 nats on the
one-concept tabular set, 40–120 rounds), while two concepts that are separating start as close
and then grow apart fast (0.005 → 0.02 → 0.3 nats in three rounds on the mixed rules).

The relative test is for data where two clusters of one concept stay far apart in nats: each
duplicate has trained on its own clients' rows (and, under label skew, their labels) and fits them
much better than the other does (0.2–0.45 nats on the main job, 2–4.5 on digits-28, against
0.02–0.05 on the tabular rules), so no absolute ``gap`` serves both. Measured against the nearest
third cluster, such a pair sat at 0.10–0.40 of that gap, and pairs of settled concepts at 0.42 or
more. The third cluster must itself have specialised (``SPECIALISED``: its model gives the pair's
members' labels at most half the probability their own models do, in geometric mean: ln 2
nats), or an early round, where every gap is small, would merge concepts that have not separated
yet; and there must be at least ``REFERENCES`` other clusters, because with one a single
comparison decides (on digits-28 at 40 rounds that merged two concepts, three models becoming
two, on development runs).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import MergeClusters, Note, RemoveClusters, ServerAction
from lightning_fedcluster.algorithms.client_state import Scope, StateEntry
from lightning_fedcluster.algorithms.discovery.merging import pair_gaps
from lightning_fedcluster.algorithms.discovery.placement import PLACED, PLACED_AT
from lightning_fedcluster.algorithms.discovery.protocol import (
    ClientTurn,
    Component,
    DiscoveryView,
    client_scores,
    cluster_shares,
)
from lightning_fedcluster.algorithms.discovery.signature_trigger import DONE, RUN_SHARE

QUIET_ROUNDS = 3
RELATIVE_GAP = 1 / 3  # a pair this much closer than either is to a specialised third cluster merges
REFERENCES = 2  # other clusters the relative test needs (with one, a single comparison decides)
SPECIALISED = math.log(2)  # nats a sample: the smallest gap to a third cluster the relative test uses
PLACED_SHARE = 0.8  # the share of the seen clients placed before K events (or LATE_SHARE of the run)
LATE_SHARE = 2 / 3
MAX_MOVED = 0.1
FITS = "cluster_fits"  # a client's mean −loss per cluster [K] at its last participation
FITS_BEFORE = "cluster_fits_before"  # the same at the participation before
FITS_TURNS = "cluster_fits_turns"  # the participations that recorded a fit
TURNS_SEEN = 3  # an unbounded run: participations of every seen client before any K event


def settled(view: DiscoveryView) -> tuple[bool, str]:
    """Whether K events may fire after this round, and the signal that says so (or why not)."""
    state, round_index = view.state, view.round_index
    if DONE in state.extra and bool((state.extra[DONE] == 0).any()):
        return False, "the concept grouping is still watching"
    if view.num_rounds is not None:
        if round_index + 1 < RUN_SHARE * view.num_rounds:
            return False, "less than a third of the run is done"
    elif int(state.seen.sum()) == 0 or round_index + 1 < TURNS_SEEN * state.num_clients / max(
        1, int(view.server.outcome.clients.numel())
    ):
        return False, "the clients have not taken part often enough"
    seen = state.seen
    placed = float((seen & (state.extra[PLACED] >= 0)).double().sum()) / max(1, int(seen.sum()))
    late = view.num_rounds is not None and round_index + 1 >= LATE_SHARE * view.num_rounds
    if placed < PLACED_SHARE and not late:
        return False, f"{placed:.0%} of the clients are placed"
    moved_at = state.extra[PLACED_AT]
    recent = seen & (state.extra[PLACED] >= 0) & (moved_at > round_index + 1 - QUIET_ROUNDS)
    moved = float(recent.double().sum()) / max(1, int(seen.sum()))
    if moved > MAX_MOVED:
        return False, f"{moved:.0%} of the clients moved in the last {QUIET_ROUNDS} rounds"
    return True, f"{moved:.0%} of the clients moved in the last {QUIET_ROUNDS} rounds"


class SettledEvents(Component):
    """Merge or remove one cluster a round once the assignments have settled (module docstring)."""

    decisive = True

    def __init__(self, gap: float, min_share: float) -> None:
        self.gap, self.min_share = gap, min_share

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        return (
            StateEntry(FITS, Scope.CLIENT, (num_clusters,), reported=True),
            StateEntry(FITS_BEFORE, Scope.CLIENT, (num_clusters,), reported=True),
            StateEntry(FITS_TURNS, Scope.CLIENT, reported=True),
        )

    def client(self, turn: ClientTurn) -> ClientTurn:
        """Keep the client's fit per cluster (mean −loss; no label term: a merge pools the labels)
        and the one of its participation before, to tell a steady gap from a growing one."""
        extra = turn.context.extra
        extra[FITS_BEFORE] = extra[FITS].clone()
        extra[FITS] = client_scores(turn.losses, turn.labels, None)
        extra[FITS_TURNS] = extra[FITS_TURNS] + 1
        return turn

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        state, outcome = view.state, view.server.outcome
        if int(state.active.sum()) < 2:
            return []
        ok, why = settled(view)
        if not ok:
            return []
        sizes, omega, seen, active = outcome.train_sizes, state.omega, state.seen, state.active
        round_number = outcome.round_index + 1
        twice = seen & (state.extra[FITS_TURNS] >= 2)
        found = steady_pair(
            omega, state.extra[FITS], state.extra[FITS_BEFORE], sizes, twice, active, self.gap
        )
        share = cluster_shares(omega, sizes, seen)
        if found is not None:
            gap, first, second, third = found
            target, source = (
                (first, second) if float(share[first]) >= float(share[second]) else (second, first)
            )
            below = (
                f"below {self.gap}"
                if gap < self.gap
                else f"below a third of the {third:.3f} to the nearest other cluster"
            )
            return [
                MergeClusters(target=target, source=source),
                Note(
                    f"round {round_number}: merged cluster {source} into cluster {target} (their members fit "
                    f"both within {gap:.3f} nats per sample, {below} and not growing; {why})"
                ),
            ]
        masked = torch.where(active, share, torch.full_like(share, torch.inf))
        smallest = int(masked.argmin())
        if float(share[smallest]) >= self.min_share:
            return []
        mask = torch.zeros_like(active)
        mask[smallest] = True
        return [
            RemoveClusters(mask),
            Note(
                f"round {round_number}: removed cluster {smallest} (it explains {float(share[smallest]):.1%} "
                f"of the rows, below {self.min_share:.0%}; {why}); {int(active.sum()) - 1} remain"
            ),
        ]


def steady_pair(
    omega: Tensor,
    fits: Tensor,
    fits_before: Tensor,
    sizes: Tensor,
    members: Tensor,
    active: Tensor,
    gap: float,
) -> tuple[float, int, int, float] | None:
    """(g_kl, k, l, d) of the closest pair that qualifies, d being the gap from k or l to the nearest
    other cluster (inf when none): g_kl below ``gap``, or below ``RELATIVE_GAP`` · d where d is at
    least ``SPECIALISED`` and k, l have ``REFERENCES`` other clusters; and no larger than at the
    members' participations before (two clusters of one concept hold a steady gap; two concepts
    that are separating have a growing one), over ``members`` (clients with both); None when none
    qualifies."""
    now = pair_gaps(omega, fits, sizes, members, active)
    before = pair_gaps(omega, fits_before, sizes, members, active)
    qualified = []
    for (k, m), g in now.items():
        outside = [
            (a if b in (k, m) else b, d) for (a, b), d in now.items() if (a in (k, m)) != (b in (k, m))
        ]
        third = min((d for _, d in outside), default=float("inf"))
        references = len({c for c, _ in outside})
        relative = references >= REFERENCES and third >= SPECIALISED and g < RELATIVE_GAP * third
        if (g < gap or relative) and g <= before.get((k, m), float("inf")):
            qualified.append((g, k, m, third))
    return min(qualified) if qualified else None
