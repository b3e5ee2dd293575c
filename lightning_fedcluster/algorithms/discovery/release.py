"""Releasing one held client before its hold ends (an option of concept grouping, ``group_release``;
ours, not the papers').

The grouping's hold ([`grouping`][lightning_fedcluster.algorithms.discovery.grouping]) keeps a
grouped client's ω as grouped for ``hold`` rounds, so that each concept's cluster learns all of its
concept's labels before FedRC's E-step may move samples again. A client the grouping put in the
wrong group is held there as well, and its cluster trains on its data for the whole hold. The hold
lengths measured trade one case against the other (the take-off study,
``benchmarks/results/takeoff.md``): a 30-round hold wins where the grouping is right, a 20-round
hold where it misplaces clients. The release ends the hold for one client at a time.

In every held round each client reports its E-step score per cluster (the merge rule's
``cluster_scores``: mean −loss − log C_{y,k} per sample). Its margin is its best score under another
cluster in use (the largest ω of some seen client,
[`unowned_clusters`][lightning_fedcluster.algorithms.discovery.retirement.unowned_clusters]'
complement) minus its score under its own (its largest ω, the held cluster). A spare cluster that no
client owns is left out: while ω is held it trains only on the (1 − share) of ω the grouping leaves
over, and it says nothing about the concepts (with one concept, every client owns the same cluster,
so no client is ever released and the run is the hold's). A held client whose margin exceeds
``margin`` nats per sample in ``rounds`` of its held rounds in a row is released: from the next
round its E-step is FedRC's, so its ω can move to the cluster that explains its data. A single
round's margin is too noisy to act on (a cluster's model jumps in some rounds); the rounds in a row
are what the offline screen (``benchmarks/placement.py release``) found to separate the clients the
grouping misplaced from those it placed right. A round in which a grouping pass acts (its own
actions rewrite the held flags) neither counts nor resets a streak."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, ServerAction, SetState
from lightning_fedcluster.algorithms.client_state import Scope, StateEntry
from lightning_fedcluster.algorithms.discovery.grouping import HELD, RELEASED, ConceptGrouping
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES, Component, DiscoveryView
from lightning_fedcluster.algorithms.discovery.retirement import unowned_clusters

STREAK = "group_release_streak"  # held rounds in a row with a margin above the release's


@dataclass(frozen=True)
class HoldRelease(Component):
    """``grouping``: the concept grouping whose hold this releases from (one of the rule's
    components, before this one); ``margin``: the score margin (nats per sample) a held client's
    best other cluster must exceed; ``rounds``: in this many of its held rounds in a row, before it
    is released. Not decisive: its streaks and releases come beside the round's K decision."""

    grouping: ConceptGrouping
    margin: float
    rounds: int = 5
    wants_scores = True

    def __post_init__(self) -> None:
        check_release_values(self.margin, self.rounds)
        if not isinstance(self.grouping, ConceptGrouping) or not self.grouping.hold:
            raise ValueError(
                f"group_release releases from a concept grouping's hold: give a ConceptGrouping with "
                f"hold > 0, got {self.grouping!r}"
            )

    def check(self, rule: Any) -> None:
        components = list(rule.components)
        mine = next(i for i, c in enumerate(components) if c is self)
        if self.grouping not in components[:mine]:
            raise ValueError(
                "group_release needs its concept grouping among the rule's components, before it "
                "(a round in which the grouping acts neither counts nor resets a streak)"
            )

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        """Each client's count of held rounds in a row with a margin above ``margin`` (server-set)."""
        return (StateEntry(STREAK, Scope.CLIENT),)

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """After a round: the streaks of the clients that reported and were held in it, and the
        release of those whose streak reached ``rounds`` (none when no reporting client was held)."""
        state, outcome = view.state, view.outcome
        flags, round_index = state.extra[HELD], outcome.round_index
        clients = outcome.clients.to("cpu", torch.long)
        held = torch.tensor(
            [self.grouping.holds(round_index, {HELD: flags[c]}) for c in clients.tolist()], dtype=torch.bool
        )
        if not bool(held.any()):
            return []
        clients = clients[held]
        scores = state.extra[CLUSTER_SCORES][clients]
        in_use = state.active & ~unowned_clusters(state.omega, state.seen, state.active)
        margins = release_margins(scores, state.omega[clients], state.active, in_use)
        streak = state.extra[STREAK].clone()
        streak[clients] = torch.where(margins > self.margin, streak[clients] + 1, torch.zeros_like(margins))
        released = clients[streak[clients] >= self.rounds]
        actions: list[ServerAction] = [SetState(STREAK, streak)]
        if released.numel():
            marked = flags.clone()
            marked[released] = RELEASED
            actions += [
                SetState(HELD, marked),
                Note(
                    f"round {round_index + 1}: released clients {released.tolist()} from the hold (another "
                    f"cluster scored over {self.margin} nats per sample higher in {self.rounds} held "
                    "rounds in a row)"
                ),
            ]
        return actions


def release_margins(scores: Tensor, omega: Tensor, active: Tensor, targets: Tensor) -> Tensor:
    """Per client [n]: its best score [n, K] under another of the ``targets`` [K] (the clusters it
    may move to) minus its score under its own, the alive cluster (``active`` [K]) of its largest
    ω [n, K]; −inf when no other target is left."""
    alive = active.to(scores.device)
    own = torch.where(alive, omega.to(scores), torch.full_like(scores, -torch.inf)).argmax(1)
    rows = torch.arange(scores.shape[0], device=scores.device)
    scores = scores.to(torch.float64)
    others = torch.where(targets.to(scores.device) & alive, scores, torch.full_like(scores, -torch.inf))
    others[rows, own] = -torch.inf
    return others.max(1).values - scores[rows, own]


def check_release_values(margin: float | None, rounds: int) -> None:
    """ValueError, naming the option and its value, for ``group_release`` (None: off) or
    ``group_release_rounds`` out of range on its own."""
    if margin is not None and (
        isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0
    ):
        raise ValueError(f"group_release must be >= 0 (nats per sample, e.g. 0.25), got {margin!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(
            f"group_release_rounds must be a positive integer (held rounds in a row), got {rounds!r}"
        )
