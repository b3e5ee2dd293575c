"""Concept grouping: a take-off for soft clustering (an option of FedRC/FedEM; ours, not the papers').

From independent starts, FedRC's K models first all learn the same mixed model, and the soft E-step
separates the concepts only once small differences between the models have grown: on the authors'
recipe that takes 17 to 50+ rounds, and on most seeds it does not happen in 60
(``docs/how-clusters-form.md``). The mixed model already tells the concepts apart, though: for each
label y a client holds, its mean prediction over the client's rows labelled y is a row of a C × C
matrix that depends on the client's labelling rule (``algorithms/signatures.py``).

Each client computes that signature in its E-step (from the K models' outputs it has anyway,
averaged over the alive models) in every round before ``group_round``. After round
``group_round``, the server groups the clients it has signatures of by k-medoids on the signature
distances (``algorithms/signatures.py``), into as many groups as alive clusters (a concept split
over two groups is merged back later by ``algorithms/discovery/merging.py``). Each group goes to the
cluster that holds most of its members' ω mass, and its members' ω becomes ``share`` on that
cluster and the rest spread evenly over the other kept clusters; FedRC's EM continues from there,
so a client put in the wrong group can still move. Clients without a signature keep their ω.

Two options make the grouping robust to clients whose signatures are noisy (corrupted images,
few labels shared with the others; measured in ``docs/how-clusters-form.md``):
``assign="mean"`` moves each client, after k-medoids, to the group whose members are closest on
average (each member weighted by the number of labels the two share, so one noisy pair, such as
the distance to a medoid that shares one label, does not decide); ``margin`` groups only the
clients whose best group is clearly closer than the second best (score < ``margin`` × second
best) and gives the others uniform ω over the alive clusters, for FedRC's E-step to place once
the grouped clusters have specialised.

``hold`` keeps the grouping for that many rounds: a grouped client's E-step gives every one of its
samples γ = its ω (the per-sample responsibilities are set aside, and ω stays as grouped). Without
it, a cluster that cannot predict some labels (it lost them to the other clusters before the
grouping) sends its own concept's samples of those labels elsewhere at once, never learns them,
and the concept's clients drift out of it (measured on digits-28, ``docs/how-clusters-form.md``).

``ramp`` (with ``hold``) eases a held cluster into its new weight: in the first ``ramp`` held rounds
a grouped client's γ blends the E-step's per-sample γ with its ω, α·ω + (1 − α)·γ with
α = h / (ramp + 1) in held round h = 1, 2, ... (then γ = ω). Without it, a cluster that had learned
only the samples it fits (γ ≈ 0 on the others) gets 0.9 of every sample at once; its round update
grew 5x and it died on 2 of 5 one-concept seeds (the take-off study, ``benchmarks/results/takeoff.md``).

``late_round`` (with ``margin``) places the clients the margin left out, once the grouped clusters
have specialised: the clients keep computing signatures until then, and after round ``late_round``
each still-ungrouped client gets ω ``share`` on the cluster whose grouped members (by their argmax
ω) have the closest signatures on average (the same shared-label-weighted mean as ``assign="mean"``);
with ``hold`` it is then held as the first pass's clients were, for ``hold`` rounds from there.
Without it FedRC's E-step places those clients, and on the authors' label skew it places the
corrupted ones in the wrong clusters (``docs/how-clusters-form.md``).

``retire`` (K from the data, with the grouping): a group whose sure clients hold less than this
share of the rows of all clients with a signature gets no cluster (its clients wait for the late
pass, as the margin's others do), and the clusters no group went to are retired when two or more
groups got one
([`retire_spare`][lightning_fedcluster.algorithms.discovery.retirement.retire_spare] says why). A
small group is typically a few corrupted clients of different concepts whose signatures look
alike; given a cluster, FedRC's removal takes it away later and hands them to the concept clusters
at once, where the late pass eases them in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, Reassign, ServerAction, SetState
from lightning_fedcluster.algorithms.client_state import CLASSES, Scope, StateEntry
from lightning_fedcluster.algorithms.client_turn import ClientReport
from lightning_fedcluster.algorithms.discovery.protocol import ClientTurn, Component, DiscoveryView
from lightning_fedcluster.algorithms.discovery.retirement import retire_spare
from lightning_fedcluster.algorithms.discovery.runner import rule_option
from lightning_fedcluster.algorithms.group_scores import (
    cluster_omega,
    confident,
    group_clusters,
    late_clusters,
    mean_distance_groups,
    mean_scores,
    medoid_scores,
    small_groups,
    uniform_omega,
)
from lightning_fedcluster.algorithms.mixture import label_sums
from lightning_fedcluster.algorithms.server_view import ClientStoreView
from lightning_fedcluster.algorithms.signatures import (
    canonical_labels,
    client_signature,
    k_medoids,
    signature_distances,
)

SIGNATURE, SIGNATURE_ROWS = "signature", "signature_rows"
HELD = "group_held"  # 1: the grouping placed the client; 2: the late pass did; 0: neither
GROUPED, LATE = 1.0, 2.0
RELEASED = 3.0  # placed, then released from the hold early (``discovery/release.py``)
ASSIGNMENTS = ("medoid", "mean")


@dataclass(frozen=True)
class ConceptGrouping(Component):
    """When and how the server groups clients by signature (see the module docstring); decisive
    (a round with a grouping pass takes no other K decision); its client hook records the
    signature from the models' outputs and holds γ at ω.

    ``group_round``: rounds before the grouping (it happens after that many rounds); ``share``:
    the grouped clients' ω on their group's cluster; ``assign``: "medoid" (k-medoids' groups) or
    "mean" (refined by the mean distance to the group's members); ``margin``: group only the
    clients whose best group score is below ``margin`` × the second best (None: every client);
    ``hold``: rounds after the grouping in which the grouped clients' γ is their ω;
    ``late_round``: after this many rounds, place the clients the margin left ungrouped (None:
    never; needs ``margin``); ``ramp``: the first held rounds in which γ blends the E-step's γ
    with ω (0: γ = ω from the first; below ``hold``); ``retire``: the share of the rows below
    which a group gets no cluster (0: every group gets one), then retire the clusters no group went
    to, when there are at least two groups (None: neither)."""

    group_round: int
    share: float = 0.9
    assign: str = "medoid"
    margin: float | None = None
    hold: int = 0
    late_round: int | None = None
    ramp: int = 0
    retire: float | None = None
    decisive = True
    wants_outputs = True

    def __post_init__(self) -> None:
        if (
            isinstance(self.group_round, bool)
            or not isinstance(self.group_round, int)
            or self.group_round < 1
        ):
            raise ValueError(
                f"group_round must be a positive integer (rounds before grouping), got {self.group_round!r}"
            )
        check_grouping_values(
            self.share,
            self.assign,
            self.margin,
            self.hold,
            self.ramp,
            self.retire,
            self.late_round,
            self.group_round,
        )
        ramp, retire, margin = self.ramp, self.retire, self.margin
        if ramp and not self.hold:
            raise ValueError("group_ramp has no effect without group_hold: set group_hold too, or drop it")
        if ramp >= max(self.hold, 1):
            raise ValueError(
                f"group_ramp={ramp} must be below group_hold={self.hold} (the held rounds that end at γ = ω)"
            )
        if retire and margin is None:
            raise ValueError(
                f"group_retire={retire} leaves small groups' clients ungrouped, which needs group_margin: "
                "set group_margin too, or use group_retire=0"
            )
        if self.late_round is not None and margin is None:
            raise ValueError(
                "group_late_round has no effect without group_margin (every client is grouped): "
                "set group_margin too, or drop it"
            )

    def check(self, rule: Any) -> None:
        if rule_option(rule, "adam_gamma"):
            raise ValueError("group_round cannot be combined with adam_gamma: use one or the other")

    def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
        """Each client's latest signature [C, C] and its row count per label [C], reported; with
        ``hold``, whether the server grouped the client (set by the server, read by the client)."""
        entries = (
            StateEntry(SIGNATURE, Scope.CLIENT, (CLASSES, CLASSES), reported=True),
            StateEntry(SIGNATURE_ROWS, Scope.CLIENT, (CLASSES,), reported=True),
        )
        flagged = self.hold or self.late_round is not None
        return entries + ((StateEntry(HELD, Scope.CLIENT),) if flagged else ())

    def client(self, turn: ClientTurn) -> ClientTurn:
        """Before the last pass, the client's signature into its state; in a held round, γ towards
        its ω (``held_report``)."""
        context = turn.context
        if context.outputs is not None and self.wants_signature(context.round_index):
            self.record_signature(context.outputs, turn.labels, context.active, context.extra)
        weight = self.hold_weight(context.round_index, context.extra)
        if weight is None:
            return turn
        omega = context.omega.to(turn.report.gamma)
        report = held_report(
            omega, context.active, turn.labels, context.num_classes, turn.report.gamma, weight
        )
        return replace(turn, report=report)

    def holds(self, round_index: int, extra: dict[str, Tensor]) -> bool:
        """Whether this client's E-step of round ``round_index`` is held (γ towards ω)."""
        return self.hold_weight(round_index, extra) is not None

    def hold_weight(self, round_index: int, extra: dict[str, Tensor]) -> float | None:
        """The weight α of ω in this client's held γ in round ``round_index`` (1 after the ramp),
        or None when the round is not held for it (always None without ``hold``)."""
        if not self.hold:
            return None
        start, flag = self.group_round, float(extra[HELD])
        if self.late_round is not None and flag == LATE:
            start = self.late_round
        elif flag != GROUPED:
            return None
        if not start <= round_index < start + self.hold:
            return None
        return min(1.0, (round_index - start + 1) / (self.ramp + 1))

    def wants_signature(self, round_index: int) -> bool:
        last = self.group_round if self.late_round is None else self.late_round
        return round_index < last

    def record_signature(
        self, outputs: Tensor, labels: Tensor, active: Tensor, extra: dict[str, Tensor]
    ) -> None:
        """The client's signature (label-conditioned mean prediction of the alive models) into its
        reported state."""
        means, counts = client_signature(outputs, labels, active, extra[SIGNATURE].shape[-1])
        extra[SIGNATURE], extra[SIGNATURE_ROWS] = means, counts

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """After round ``view.round_index``: the grouping's (or the late pass's) actions when due,
        else none."""
        state, round_index = view.state, view.round_index
        if self.late_round is not None and round_index == self.late_round - 1:
            return self._late_actions(state, round_index)
        if round_index != self.group_round - 1:
            return []
        clients = (state.seen & (state.extra[SIGNATURE_ROWS].sum(1) > 0)).nonzero().flatten()
        if clients.numel() < 2:
            return [
                Note(
                    f"round {round_index + 1}: concept grouping skipped (fewer than two clients with "
                    "signatures)"
                )
            ]
        rows = state.extra[SIGNATURE_ROWS][clients]
        distances, _ = signature_distances(state.extra[SIGNATURE][clients], rows)
        groups, _ = k_medoids(distances, int(state.active.sum()))
        held = (rows >= 1).to(torch.float64)
        shared = held @ held.T  # labels each pair holds both: the weight of their distance
        if self.assign == "mean":
            groups = mean_distance_groups(distances, shared, groups)
        if self.margin is None:
            taken = group_clusters(groups, state.omega[clients], state.active)
            omega = cluster_omega(taken, state.active, self.share)
            sizes = torch.bincount(groups).tolist()
            note = Note(
                f"round {round_index + 1}: grouped {clients.numel()} clients by concept signature into "
                f"{len(sizes)} groups of {sizes} clients"
            )
            retired = retire_spare(self.retire is not None, taken, state.active)
            return [Reassign(clients, omega), *self._held(state, clients), note, *retired]
        if self.assign == "mean":
            scores = mean_scores(distances, shared, groups)
        else:
            scores = medoid_scores(distances, groups)
        sure = confident(scores, self.margin)
        if self.retire:
            sure &= ~small_groups(groups, sure, rows.sum(1), self.retire)
        omega = uniform_omega(clients.numel(), state.active)
        taken = torch.empty(0, dtype=torch.long)
        if bool(sure.any()):
            kept = canonical_labels(groups[sure])
            taken = group_clusters(kept, state.omega[clients][sure], state.active)
            omega[sure] = cluster_omega(taken, state.active, self.share)
            sizes = torch.bincount(kept).tolist()
        else:
            sizes = []
        note = Note(
            f"round {round_index + 1}: grouped {int(sure.sum())} of {clients.numel()} clients by concept "
            f"signature into {len(sizes)} groups of {sizes} clients (margin {self.margin}); "
            f"{int((~sure).sum())} set to uniform ω"
        )
        retired = retire_spare(self.retire is not None, taken, state.active)
        return [Reassign(clients, omega), *self._held(state, clients[sure]), note, *retired]

    def _late_actions(self, state: ClientStoreView, round_index: int) -> list[ServerAction]:
        """The late pass: every seen client with a signature that no pass placed goes to the cluster
        of [`late_clusters`][lightning_fedcluster.algorithms.group_scores.late_clusters], with ω
        ``share`` there; flagged ``LATE`` (held with ``hold``)."""
        flags = state.extra[HELD]
        with_signature = state.seen & (state.extra[SIGNATURE_ROWS].sum(1) > 0)
        grouped, waiting = with_signature & (flags > 0), with_signature & (flags == 0)
        if not bool(grouped.any()) or not bool(waiting.any()):
            return [Note(f"round {round_index + 1}: late grouping pass: no ungrouped client to place")]
        clients = (grouped | waiting).nonzero().flatten()
        rows = state.extra[SIGNATURE_ROWS][clients]
        distances, _ = signature_distances(state.extra[SIGNATURE][clients], rows)
        held = (rows >= 1).to(torch.float64)
        clusters = late_clusters(
            distances, held @ held.T, state.omega[clients], state.active, grouped[clients]
        )
        placed = waiting[clients] & (clusters >= 0)
        if not bool(placed.any()):
            return [Note(f"round {round_index + 1}: late grouping pass: no ungrouped client shares a label")]
        omega = cluster_omega(clusters[placed], state.active, self.share)
        marked = flags.clone()
        marked[clients[placed]] = LATE
        note = Note(
            f"round {round_index + 1}: late grouping pass placed {int(placed.sum())} ungrouped clients in "
            f"clusters {clusters[placed].tolist()}"
        )
        return [Reassign(clients[placed], omega), SetState(HELD, marked), note]

    def _held(self, state: ClientStoreView, grouped: Tensor) -> list[ServerAction]:
        """With ``hold`` (or a late pass): the action that marks the grouped clients (and only them)."""
        if not self.hold and self.late_round is None:
            return []
        flags = torch.zeros_like(state.extra[HELD])
        flags[grouped] = 1.0
        return [SetState(HELD, flags)]


def held_report(
    omega: Tensor,
    active: Tensor,
    labels: Tensor,
    num_classes: int,
    e_step_gamma: Tensor | None = None,
    weight: float = 1.0,
) -> ClientReport:
    """A held client's E-step: every sample's γ is the client's ω [K] (over the alive clusters),
    or, during the ramp, weight · ω + (1 − weight) · ``e_step_gamma`` [N, K]; ω is unchanged,
    and the label sums follow from that γ."""
    weights = omega.to(torch.float64) * active.to(device=omega.device, dtype=torch.float64)
    weights = weights / weights.sum()
    gamma = weights.expand(labels.numel(), -1).clone()
    if weight < 1.0:
        if e_step_gamma is None:
            raise ValueError("a held E-step with weight < 1 blends with the E-step's γ: pass e_step_gamma")
        gamma = weight * gamma + (1.0 - weight) * e_step_gamma.to(gamma)
    return ClientReport(gamma=gamma, omega=weights, label_sums=label_sums(gamma, labels, num_classes))


def check_grouping_values(
    share: float,
    assign: str,
    margin: float | None,
    hold: int,
    ramp: int,
    retire: float | None,
    late_round: int | None,
    group_round: int | None = None,
) -> None:
    """ValueError, naming the option and its value, for a grouping option out of range on its own
    (``FedRC.Config`` calls it before asking whether ``group_round`` is set, so that a bad value is
    named first; ``group_round``: None when not set)."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"group_share must be in (0, 1], got {share!r}")
    if assign not in ASSIGNMENTS:
        raise ValueError(f"group_assign must be one of {ASSIGNMENTS}, got {assign!r}")
    if margin is not None and (
        isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < 1
    ):
        raise ValueError(
            f"group_margin must be in (0, 1) (a client's best group score over its second best), "
            f"got {margin!r}"
        )
    for name, rounds in (("group_hold", hold), ("group_ramp", ramp)):
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"{name} must be a non-negative integer (rounds), got {rounds!r}")
    if retire is not None and (
        isinstance(retire, bool) or not isinstance(retire, (int, float)) or not 0 <= retire < 1
    ):
        raise ValueError(
            f"group_retire must be a share of the rows in [0, 1) (0: retire only the clusters no "
            f"group went to), got {retire!r}"
        )
    above = 0 if group_round is None else group_round
    if late_round is not None and (
        isinstance(late_round, bool) or not isinstance(late_round, int) or late_round <= above
    ):
        named = "group_round" if group_round is None else f"group_round={group_round}"
        raise ValueError(
            f"group_late_round must be an integer above {named} (rounds before the late pass), "
            f"got {late_round!r}"
        )
