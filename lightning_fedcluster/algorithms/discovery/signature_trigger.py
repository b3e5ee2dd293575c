"""Concept grouping fired by its signal: when the clients' prediction signatures separate.

The signature ([`signatures`][lightning_fedcluster.algorithms.signatures]: per label a client
holds, the mixed models' mean prediction over its rows of that label) tells concepts made by
relabelling apart from the first rounds, long before FedRC's E-step does; on concepts that are
labelling rules over the same inputs it carries almost nothing (two classes: every client looks
alike). So the grouping fires only when the signal says it can:

- after every round in the first ``RUN_SHARE`` of the run, the server partitions the clients it
  has signatures of into the clearest 2..K groups (k-medoids, the silhouette decides how many);
- it fires when the partition is **separated** (silhouette >= ``SEPARATED``), **stable** (adjusted
  Rand index >= ``STABLE`` against the previous round's, over the clients both grouped) for
  ``ROUNDS_STABLE`` rounds in a row, and covers at least ``COVERAGE`` of the clients;
- groups holding less than ``min_share`` of the rows get no cluster (their clients stay with
  FedRC's E-step); each other group goes to a distinct cluster (the one holding most of its
  members' ω), its clients are placed there and held (``placement.py``), and the clusters no
  group went to are retired when two or more groups got one: the number of clear groups is the
  evidence for K;
- if it has not fired by then, it gives up (and says so): the run goes on as FedRC with placement;
  with two classes it never starts (a centred row of two probabilities is ±(−1, 1): the signature
  keeps only a sign, which most labelling rules share).
"""

from __future__ import annotations

import torch

from lightning_fedcluster.algorithms.actions import Note, Reassign, ServerAction, SetState
from lightning_fedcluster.algorithms.client_state import CLASSES, Scope, StateEntry
from lightning_fedcluster.algorithms.discovery.placement import place_clients
from lightning_fedcluster.algorithms.discovery.protocol import ClientTurn, Component, DiscoveryView
from lightning_fedcluster.algorithms.discovery.retirement import retire_spare
from lightning_fedcluster.algorithms.discovery.signals import best_partition, partition_agreement
from lightning_fedcluster.algorithms.group_scores import cluster_omega, group_clusters
from lightning_fedcluster.algorithms.signatures import (
    canonical_labels,
    client_signature,
    signature_distances,
)

SIGNATURE, SIGNATURE_ROWS = "trigger_signature", "trigger_signature_rows"
GROUP = "signature_group"  # each client's group in the last round's partition (-1: none)
STABLE_STREAK = "signature_stable_rounds"  # the same for every client: rounds in a row stable
DONE = "grouping_done"  # the same for every client: 1 fired, 2 gave up, 0 still watching
FIRED, GAVE_UP = 1.0, 2.0
RUN_SHARE = 1 / 3  # the grouping watches the first third of the run
SEPARATED = 0.5  # the silhouette a partition needs
STABLE = 0.9  # the agreement with the previous round's partition it needs
ROUNDS_STABLE = 3
COVERAGE = 0.8  # the share of the clients with a signature it needs
SHARE = 0.9  # a grouped client's ω on its group's cluster (until its placement takes over)


def watching_until(num_rounds: int | None) -> int | None:
    """The last round index (0-based) in which the grouping may fire (None: the run is unbounded)."""
    return None if num_rounds is None else max(1, int(num_rounds * RUN_SHARE)) - 1


class SignatureGrouping(Component):
    """Group clients by prediction signature once the signatures separate (module docstring);
    ``min_share``: the share of the rows a group needs for a cluster of its own."""

    wants_outputs = True  # not decisive: it keeps its bookkeeping every round

    def __init__(self, min_share: float) -> None:
        self.min_share = min_share

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        return (
            StateEntry(SIGNATURE, Scope.CLIENT, (CLASSES, CLASSES), reported=True),
            StateEntry(SIGNATURE_ROWS, Scope.CLIENT, (CLASSES,), reported=True),
            StateEntry(GROUP, Scope.CLIENT, initial=-1.0),
            StateEntry(STABLE_STREAK, Scope.CLIENT),
            StateEntry(DONE, Scope.CLIENT),
        )

    def client(self, turn: ClientTurn) -> ClientTurn:
        context = turn.context
        if float(context.extra[DONE]) == 0 and context.outputs is not None:
            means, counts = client_signature(
                context.outputs, turn.labels, context.active, context.extra[SIGNATURE].shape[-1]
            )
            context.extra[SIGNATURE], context.extra[SIGNATURE_ROWS] = means, counts
        return turn

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        state, round_index = view.state, view.round_index
        done = state.extra[DONE]
        if bool((done > 0).all()):
            return []
        if state.extra[SIGNATURE].shape[-1] < 3:
            return [
                SetState(DONE, torch.full_like(done, GAVE_UP)),
                Note(
                    f"round {round_index + 1}: concept grouping off: with two classes a prediction "
                    "signature carries only a sign, the same under most labelling rules"
                ),
            ]
        last = watching_until(view.num_rounds)
        if last is not None and round_index >= last:
            return [
                SetState(DONE, torch.full_like(done, GAVE_UP)),
                Note(
                    f"round {round_index + 1}: concept grouping gave up (the prediction signatures did "
                    f"not separate in the first {last + 1} rounds); FedRC's E-step and placement go on"
                ),
            ]
        rows = state.extra[SIGNATURE_ROWS]
        with_signature = state.seen & (rows.sum(1) > 0)
        clients = with_signature.nonzero().flatten()
        groups_now = torch.full_like(state.extra[GROUP], -1.0)
        if clients.numel() < max(3, COVERAGE * state.num_clients):
            return [SetState(GROUP, groups_now), SetState(STABLE_STREAK, torch.zeros_like(done))]
        distances, _ = signature_distances(state.extra[SIGNATURE][clients], rows[clients])
        groups, separation = best_partition(distances, int(state.active.sum()))
        before = state.extra[GROUP][clients].long()
        both = before >= 0
        agreement = partition_agreement(groups[both], before[both]) if int(both.sum()) >= 3 else 0.0
        stable = separation >= SEPARATED and agreement >= STABLE and float(both.double().mean()) >= COVERAGE
        streak = (float(state.extra[STABLE_STREAK][0]) + 1.0) if stable else 0.0
        groups_now[clients] = groups.to(groups_now.dtype)
        bookkeeping: list[ServerAction] = [
            SetState(GROUP, groups_now),
            SetState(STABLE_STREAK, torch.full_like(done, streak)),
        ]
        if streak < ROUNDS_STABLE:
            return bookkeeping
        return bookkeeping + self._group(view, clients, groups, rows[clients].sum(1), separation)

    def _group(
        self,
        view: DiscoveryView,
        clients: torch.Tensor,
        groups: torch.Tensor,
        sizes: torch.Tensor,
        separation: float,
    ) -> list[ServerAction]:
        """The grouping itself: big groups to clusters, their clients placed; spare clusters retired."""
        state, round_index = view.state, view.round_index
        share = torch.zeros(int(groups.max()) + 1, dtype=torch.float64)
        share.index_add_(0, groups, sizes.to(torch.float64))
        share = share / share.sum()
        big = share[groups] >= self.min_share
        done = torch.full_like(state.extra[DONE], FIRED)
        if not bool(big.any()):
            return [
                SetState(DONE, done),
                Note(f"round {round_index + 1}: concept grouping found no group of its own"),
            ]
        kept = canonical_labels(groups[big])
        taken = group_clusters(kept, state.omega[clients][big], state.active)
        members = clients[big]
        sizes_of = torch.bincount(kept).tolist()
        note = Note(
            f"round {round_index + 1}: grouped {members.numel()} of {clients.numel()} clients by prediction "
            f"signature into {len(sizes_of)} groups of {sizes_of} clients (silhouette {separation:.2f}, "
            f"stable for {ROUNDS_STABLE} rounds) on clusters {sorted(set(taken.tolist()))}"
        )
        return [
            SetState(DONE, done),
            Reassign(members, cluster_omega(taken, state.active, SHARE)),
            *place_clients(state.extra, members, taken, round_index),
            note,
            *retire_spare(True, taken, state.active),
        ]
