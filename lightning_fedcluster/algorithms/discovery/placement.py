"""Placement: a client whose rows clearly fit one cluster trains that cluster alone.

FedRC's soft E-step keeps every sample's γ near 1/K while the K models are still mixtures: on
concepts that are labelling rules agreeing on half of the rows, γ on a client's own cluster stays
at 0.35–0.43 for 40 of 60 rounds, each model trains on every concept's rows at about a third of
their weight, and FedRC ends 9–14 points below IFCA with every client placed
(``benchmarks/results/discovery_off_cells.md``). Training by assignment closes that gap, but
assigning from the first round (IFCA) collapses clusters on other data. Placement assigns on
evidence:

- after each round the server compares every reporting client's mean score per cluster (the
  E-step's mean −loss − log C per sample) *relative to the other reporting clients'* (minus each
  cluster's median), so a model that fits everyone better gains nobody a lead;
- a client whose best relative fit is on the same cluster in two participations in a row is
  placed there: the repetition, not a size of lead, is the guard against noise (a lead of
  0.01–0.1 nats per sample placed the clients of rule concepts 10–40 rounds later);
- a placed client moves on its own score less *half* the cluster's median over the round's clients
  (the same two participations in a row), and only to a cluster whose own score of its rows beats
  its current cluster's. The fit relative to the others alone points placed clients back and forth
  once the clusters have specialised (on digits-28 at 120 rounds one run moved placed clients 188
  times, 76 of them to a cluster that fitted them worse, and ended 20 points below its best round),
  and it keeps a client on a cluster that fits everyone a little worse (two copies of one concept
  then both keep clients and never merge). The score itself moves clients to the strongest cluster
  even when it holds another concept (two concepts merged on digits-28); half the median weighs
  the client's own lead against the cluster's lead on everyone;
- while the concept grouping watches the prediction signatures (``signature_trigger.py``) nobody
  is placed: the grouping places first;
- a placed client's samples all get γ = 1 on its cluster and it trains that copy alone, after a
  short ramp (``RAMP`` participations of α·one-hot + (1 − α)·γ, α = h / (RAMP + 1)) so that a
  cluster handed samples it had not fitted does not take one large step;
- a client placed by the concept grouping is held: it moves only once its own cluster has been its
  best fit (the fit confirms the grouping), or after ``HOLD_TURNS`` participations without.

A client not placed keeps FedRC's soft E-step, its copies weighed by N_i · (½ + ½ ω_ik) (the ω
weighting at half strength, which kept the models stable without a gradient clip).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, ServerAction, SetState
from lightning_fedcluster.algorithms.client_state import Scope, StateEntry
from lightning_fedcluster.algorithms.client_turn import ClientReport
from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    ClientTurn,
    Component,
    DiscoveryView,
)
from lightning_fedcluster.algorithms.discovery.signals import fit_margins
from lightning_fedcluster.algorithms.mixture import label_sums

PLACED = "placed_cluster"  # the cluster a client is placed on (-1: none)
PLACED_AT = "placed_round"  # the round index of its first placed E-step (for the ramp)
PLACED_TURNS = "placed_turns"  # its participations since it was placed
CONFIRMED = "placed_confirmed"  # 1: free to move (placed on its fit, or its fit confirmed it)
CANDIDATE = "place_candidate"  # the cluster its last participation's fit pointed to (-1: none)
WATCHING = "grouping_done"  # the signature grouping's flag: 0 while it still watches
STREAK = "place_streak"  # participations in a row its fit pointed to CANDIDATE
RAMP = 3  # placed participations over which γ goes from the E-step's to one-hot
HOLD_TURNS = 10  # a grouped client is held at most this many participations against its fit
TURNS_IN_A_ROW = 2  # participations in a row a fit must point to a cluster before a placement
MOVE_MEDIAN_SHARE = 0.5  # a placed client's fit: its score less this share of the cluster's median
COPY_WEIGHT_STRENGTH = 0.5  # an unplaced client's copy k weighs N_i · ((1 − s) + s · ω_ik)


class Placement(Component):
    """Place clients on the cluster their rows fit best relative to the other clients (see the
    module docstring); ``margin``: the lead over the second best, in nats per sample, that counts
    (0: any lead; two participations in a row on the same cluster are the guard against noise)."""

    wants_scores = True

    def __init__(self, margin: float = 0.0) -> None:
        self.margin = margin

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        return (
            StateEntry(PLACED, Scope.CLIENT, initial=-1.0),
            StateEntry(PLACED_AT, Scope.CLIENT, initial=-1.0),
            StateEntry(PLACED_TURNS, Scope.CLIENT),
            StateEntry(CONFIRMED, Scope.CLIENT),
            StateEntry(CANDIDATE, Scope.CLIENT, initial=-1.0),
            StateEntry(STREAK, Scope.CLIENT),
        )

    def client(self, turn: ClientTurn) -> ClientTurn:
        """A placed client trains its cluster (after the ramp), an unplaced one weighs its copies
        by ω at half strength (its scores per cluster the rule reports: ``wants_scores``)."""
        context = turn.context
        cluster = int(context.extra[PLACED])
        if cluster < 0 or not bool(context.active[cluster]):
            omega = turn.report.omega.to(torch.float64)
            weights = (1.0 - COPY_WEIGHT_STRENGTH) + COPY_WEIGHT_STRENGTH * omega
            return replace(turn, copy_weights=weights)
        held_round = context.round_index - int(context.extra[PLACED_AT]) + 1
        alpha = min(1.0, max(held_round, 1) / (RAMP + 1))
        return replace(
            turn,
            report=placed_report(turn.report.gamma, turn.labels, cluster, alpha, context.num_classes),
            train_clusters=(cluster,) if alpha >= 1.0 else None,
        )

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """The streaks of the reporting clients' fits, and the placements (or moves) they earn."""
        state, outcome = view.state, view.server.outcome
        clients = outcome.clients.to("cpu", torch.long)
        if clients.numel() < 3 or int(state.active.sum()) < 2:
            return []
        if WATCHING in state.extra and bool((state.extra[WATCHING] == 0).any()):
            return []  # the concept grouping still watches the signatures: it places first
        extra = {
            name: state.extra[name]
            for name in (PLACED, PLACED_AT, PLACED_TURNS, CONFIRMED, CANDIDATE, STREAK)
        }
        placed = extra[PLACED][clients].long()
        alive = state.active
        placed = torch.where((placed >= 0) & alive[placed.clamp_min(0)], placed, torch.full_like(placed, -1))
        scores = state.extra[CLUSTER_SCORES][clients]
        share = torch.where(placed >= 0, MOVE_MEDIAN_SHARE, 1.0).to(torch.float64)[:, None]
        best, margin = fit_margins(scores, alive, share)  # placed clients: half the medians
        pointed = torch.where(margin > self.margin, best, torch.full_like(best, -1))
        previous = extra[CANDIDATE][clients].long()
        streak = torch.where(
            pointed >= 0,
            torch.where(pointed == previous, extra[STREAK][clients] + 1, torch.ones_like(margin)),
            torch.zeros_like(margin),
        )
        turns = torch.where(placed >= 0, extra[PLACED_TURNS][clients] + 1, torch.zeros_like(margin))
        confirmed = (extra[CONFIRMED][clients] > 0) | ((placed >= 0) & (best == placed))
        free = (placed < 0) | confirmed | (turns >= HOLD_TURNS)
        move = free & (streak >= TURNS_IN_A_ROW) & (pointed != placed) & fits_better(scores, placed, pointed)
        new_placed = torch.where(move, pointed, placed)
        extra[PLACED][clients] = new_placed.to(torch.float64)
        extra[PLACED_AT][clients] = torch.where(
            move, torch.full_like(margin, outcome.round_index + 1.0), extra[PLACED_AT][clients]
        )
        extra[PLACED_TURNS][clients] = torch.where(move, torch.zeros_like(turns), turns)
        extra[CONFIRMED][clients] = (move | confirmed).to(torch.float64)
        extra[CANDIDATE][clients] = pointed.to(torch.float64)
        extra[STREAK][clients] = streak
        actions: list[ServerAction] = [SetState(name, value) for name, value in extra.items()]
        if bool(move.any()):
            moved = clients[move].tolist()
            targets = new_placed[move].tolist()
            actions.append(
                Note(
                    f"round {outcome.round_index + 1}: placed {len(moved)} client(s) by their fit "
                    f"(best relative fit, ahead by over {self.margin} nats per sample, in {TURNS_IN_A_ROW} "
                    f"participations in a row; a placed client's fit counts half the medians): "
                    f"{dict(zip(moved, targets, strict=True))}"
                )
            )
        return actions


def fits_better(scores: Tensor, placed: Tensor, pointed: Tensor) -> Tensor:
    """Per client [n]: True where it is unplaced (``placed`` < 0), or where its own mean score
    (``scores`` [n, K]) is higher on the ``pointed`` cluster than on the one it is placed on."""
    rows = torch.arange(scores.shape[0], device=scores.device)
    scores = scores.to(torch.float64)
    current = scores[rows, placed.clamp_min(0)]
    target = scores[rows, pointed.clamp_min(0)]
    return (placed < 0) | (target > current)


def placed_report(
    gamma: Tensor, labels: Tensor, cluster: int, alpha: float, num_classes: int
) -> ClientReport:
    """A placed client's E-step: γ = α · one-hot(cluster) + (1 − α) · the E-step's γ [N, K]; ω is
    its mean and the label sums follow from it."""
    target = torch.zeros_like(gamma, dtype=torch.float64)
    target[:, cluster] = 1.0
    mixed = alpha * target + (1.0 - alpha) * gamma.to(torch.float64) if alpha < 1.0 else target
    mixed = mixed.to(gamma.dtype)
    return ClientReport(gamma=mixed, omega=mixed.mean(0), label_sums=label_sums(mixed, labels, num_classes))


def place_clients(
    state_extra: dict[str, Tensor], clients: Tensor, clusters: Tensor, round_index: int
) -> list[ServerAction]:
    """Actions placing ``clients`` [n] on ``clusters`` [n] from the next round on, held (not
    confirmed) as the concept grouping places them; the other clients keep their placement."""
    placed = state_extra[PLACED].clone()
    placed_at = state_extra[PLACED_AT].clone()
    turns = state_extra[PLACED_TURNS].clone()
    confirmed = state_extra[CONFIRMED].clone()
    placed[clients] = clusters.to(placed.dtype)
    placed_at[clients] = float(round_index + 1)
    turns[clients] = 0.0
    confirmed[clients] = 0.0
    return [
        SetState(PLACED, placed),
        SetState(PLACED_AT, placed_at),
        SetState(PLACED_TURNS, turns),
        SetState(CONFIRMED, confirmed),
    ]
