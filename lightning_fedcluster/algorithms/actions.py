"""What a rule's server hooks return: typed actions on the cluster models and the client store,
which the engine applies in order. Rules never touch models; the engine never names an
algorithm (a server step reads as inputs in, actions out)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class RoundOutcome:
    """What the server knows after a round's aggregation: the clients that reported [n], their
    reported ω [n, K], their training sizes [n], every client's training size [M] and, when the
    rule asked for them (``Algorithm.round_vectors``), one flat float32 vector per client [n, P]."""

    round_index: int
    clients: Tensor
    omega: Tensor
    sizes: Tensor
    train_sizes: Tensor
    vectors: Tensor | None = None


@dataclass(frozen=True)
class RemoveClusters:
    """Mark the clusters in ``mask`` [K] dead and renormalise ω over the rest (adaptive K)."""

    mask: Tensor


@dataclass(frozen=True)
class CopyCluster:
    """Cluster ``target`` becomes alive with a copy of cluster ``source``'s global model (a split)."""

    target: int
    source: int


@dataclass(frozen=True)
class SplitCluster:
    """Cluster ``target`` restarts as a copy of cluster ``source``'s global model and takes the
    fraction ``to_target`` [n] of each of ``clients`` [n]'s ω and label-sum mass on ``source``;
    every client's local-optimizer state for ``target`` restarts (a dead cluster re-seeded)."""

    target: int
    source: int
    clients: Tensor
    to_target: Tensor


@dataclass(frozen=True)
class SetCentre:
    """Cluster ``cluster``'s global model becomes the flat ``vector`` (e.g. a K-means centre)."""

    cluster: int
    vector: Tensor


@dataclass(frozen=True)
class Reassign:
    """The given clients [n] get mixture weights / assignments ``omega`` [n, K]."""

    clients: Tensor
    omega: Tensor


@dataclass(frozen=True)
class SetState:
    """The rule's own client-store entry ``name`` (one of its ``initial_extra``) becomes ``value``."""

    name: str
    value: Tensor


@dataclass(frozen=True)
class Note:
    """A line for the console (rank zero), e.g. which clients moved."""

    text: str


ServerAction = RemoveClusters | CopyCluster | SplitCluster | SetCentre | Reassign | SetState | Note
