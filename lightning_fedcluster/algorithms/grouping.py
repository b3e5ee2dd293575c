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
over two groups is merged back later by ``algorithms/merging.py``). Each group goes to the
cluster that holds most of its members' ω mass, and its members' ω becomes ``share`` on that
cluster and the rest spread evenly over the other kept clusters; FedRC's EM continues from there,
so a client put in the wrong group can still move. Clients without a signature keep their ω.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, Reassign, ServerAction
from lightning_fedcluster.algorithms.client_state import CLASSES, ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.server_view import ClientStoreView
from lightning_fedcluster.algorithms.signatures import client_signature, k_medoids, signature_distances

SIGNATURE, SIGNATURE_ROWS = "signature", "signature_rows"


@dataclass(frozen=True)
class ConceptGrouping:
    """When and how the server groups clients by signature (see the module docstring).

    ``group_round``: rounds before the grouping (it happens after that many rounds); ``share``:
    the grouped clients' ω on their group's cluster."""

    group_round: int
    share: float = 0.9

    def __post_init__(self) -> None:
        if (
            isinstance(self.group_round, bool)
            or not isinstance(self.group_round, int)
            or self.group_round < 1
        ):
            raise ValueError(
                f"group_round must be a positive integer (rounds before grouping), got {self.group_round!r}"
            )
        if (
            isinstance(self.share, bool)
            or not isinstance(self.share, (int, float))
            or not 0 < self.share <= 1
        ):
            raise ValueError(f"group_share must be in (0, 1], got {self.share!r}")

    def state_entries(self) -> tuple[StateEntry, ...]:
        """Each client's latest signature [C, C] and its row count per label [C], reported."""
        return (
            StateEntry(SIGNATURE, Scope.CLIENT, (CLASSES, CLASSES), reported=True),
            StateEntry(SIGNATURE_ROWS, Scope.CLIENT, (CLASSES,), reported=True),
        )

    def wants_signature(self, round_index: int) -> bool:
        return round_index < self.group_round

    def record_signature(
        self, outputs: Tensor, labels: Tensor, active: Tensor, extra: dict[str, Tensor]
    ) -> None:
        """The client's signature (label-conditioned mean prediction of the alive models) into its
        reported state."""
        means, counts = client_signature(outputs, labels, active, extra[SIGNATURE].shape[-1])
        extra[SIGNATURE], extra[SIGNATURE_ROWS] = means, counts

    def actions(self, state: ClientState | ClientStoreView, round_index: int) -> list[ServerAction]:
        """After round ``round_index``: the grouping's actions when it is due, else none."""
        if round_index != self.group_round - 1:
            return []
        clients = (state.seen & (state.extra[SIGNATURE_ROWS].sum(1) > 0)).nonzero().flatten()
        if clients.numel() < 2:
            return [
                Note(
                    f"round {round_index}: concept grouping skipped (fewer than two clients with signatures)"
                )
            ]
        distances, _ = signature_distances(
            state.extra[SIGNATURE][clients], state.extra[SIGNATURE_ROWS][clients]
        )
        groups, _ = k_medoids(distances, int(state.active.sum()))
        omega = grouped_omega(groups, state.omega[clients], state.active, self.share)
        sizes = torch.bincount(groups).tolist()
        note = Note(
            f"round {round_index}: grouped {clients.numel()} clients by concept signature into "
            f"{len(sizes)} groups of {sizes} clients"
        )
        return [Reassign(clients, omega), note]


def grouped_omega(groups: Tensor, omega: Tensor, active: Tensor, share: float) -> Tensor:
    """ω [n, K] of the grouped clients: each group goes to a distinct alive cluster, chosen to keep
    most of the members' current ω mass (Hungarian matching); members get ``share`` on it and
    (1 − share) spread evenly over the other alive clusters."""
    alive = active.nonzero().flatten()
    count = int(groups.max()) + 1
    mass = torch.zeros(count, alive.numel(), dtype=torch.float64)
    mass.index_add_(0, groups, omega[:, alive].to(torch.float64))
    rows, cols = linear_sum_assignment(mass.numpy(), maximize=True)
    cluster_of = torch.empty(count, dtype=torch.long)
    cluster_of[torch.as_tensor(rows)] = alive[torch.as_tensor(cols)]
    result = torch.zeros(groups.numel(), active.numel(), dtype=torch.float64)
    if alive.numel() == 1:
        result[:, alive[0]] = 1.0
        return result
    result[:, alive] = (1 - share) / (alive.numel() - 1)
    result[torch.arange(groups.numel()), cluster_of[groups]] = share
    return result
