"""What a rule's server hooks return: typed actions on the cluster models and the client store.
Each action applies itself (``action.apply(target)``) to an ``ActionTarget``: the server's
client store, the global cluster models and two callbacks, so the engine runs a rule's actions
without knowing them and a new kind of server decision (a merge, a split) is one class here.
An action that replaces a cluster's model derives from ``ReplaceModel``, which restarts that
cluster's server-optimizer state. Rules never touch models; the engine never names an algorithm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.server_view import RoundOutcome

__all__ = [
    "ActionTarget",
    "CopyCluster",
    "MergeClusters",
    "Note",
    "Reassign",
    "RemoveClusters",
    "ReplaceModel",
    "RoundOutcome",
    "ServerAction",
    "SetCentre",
    "SetState",
    "SplitCluster",
    "copy_model",
    "write_flat_into",
]


class ActionTarget(Protocol):
    """What a server action changes: the server's client store, the global models (per cluster,
    its federated tensors), and two callbacks: ``model_replaced(k)`` when cluster k's model is
    replaced rather than updated (a server optimizer forgets its state for k), ``say`` for a
    console line."""

    client_state: ClientState
    global_clusters: list[list[Tensor]]

    def model_replaced(self, cluster: int) -> None: ...

    def say(self, text: str) -> None: ...


def write_flat_into(tensors: Sequence[Tensor], vector: Tensor) -> None:
    """Copy a flat vector into a list of tensors (e.g. a cluster's global snapshot), in place."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(vector[offset : offset + t.numel()].view_as(t).to(t))
            offset += t.numel()


def copy_model(target: ActionTarget, source: int, destination: int) -> None:
    """Cluster ``destination``'s global model becomes a copy of cluster ``source``'s."""
    clusters = target.global_clusters
    with torch.no_grad():
        for t, g in zip(clusters[destination], clusters[source], strict=True):
            t.copy_(g)


class ServerAction:
    """A server decision. ``rewrites`` names the client-store entries it sets for clients (a
    deployment sends those to the nodes that hold the clients)."""

    rewrites: tuple[str, ...] = ()

    def apply(self, target: ActionTarget) -> None:
        raise NotImplementedError


class ReplaceModel(ServerAction):
    """A decision that replaces cluster ``replaced``'s global model rather than updating it (a new
    centre, a copy, a split). Subclasses write the new model (and whatever else they change) in
    ``replace``; ``apply`` then always restarts that cluster's server-optimizer state, so the
    momentum or Adam moments of the old model never move the new one. Subclasses override
    ``replace``, never ``apply`` (refused when the class is defined)."""

    @property
    def replaced(self) -> int:
        """The cluster whose model this action replaces."""
        raise NotImplementedError

    def replace(self, target: ActionTarget) -> None:
        raise NotImplementedError

    def apply(self, target: ActionTarget) -> None:
        self.replace(target)
        target.model_replaced(self.replaced)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "apply" in vars(cls):
            raise TypeError(
                f"{cls.__name__} overrides apply(); a ReplaceModel writes its model in replace(), and "
                "apply() restarts the cluster's server-optimizer state after it"
            )


@dataclass(frozen=True)
class RemoveClusters(ServerAction):
    """Mark the clusters in ``mask`` [K] dead and renormalise ω over the rest (adaptive K), and
    the per-sample mixtures named in ``renormalise`` (FedRC-Adam's γ) with it."""

    mask: Tensor
    renormalise: tuple[str, ...] = ()

    def apply(self, target: ActionTarget) -> None:
        target.client_state.remove_clusters(self.mask, self.renormalise)


@dataclass(frozen=True)
class MergeClusters(ServerAction):
    """Cluster ``source`` merges into cluster ``target``, which keeps its model: every client's ω
    and label-sum mass on ``source`` moves to ``target`` (with the per-sample mixtures named in
    ``mixtures``, e.g. FedRC-Adam's γ), then ``source`` is removed. A Flower deployment sends the
    moved ω and label sums to the nodes with their clients' next round; per-sample mixtures stay
    on the nodes, which cannot mirror their move (the Flower server refuses it by name)."""

    target: int
    source: int
    mixtures: tuple[str, ...] = ()

    @property
    def rewrites(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("omega", "label_sums", *self.mixtures)

    def apply(self, target: ActionTarget) -> None:
        target.client_state.merge_clusters(self.source, self.target, self.mixtures)


@dataclass(frozen=True)
class CopyCluster(ReplaceModel):
    """Cluster ``target`` becomes alive with a copy of cluster ``source``'s global model (a split)."""

    target: int
    source: int

    @property
    def replaced(self) -> int:
        return self.target

    def replace(self, target: ActionTarget) -> None:
        target.client_state.active[self.target] = True
        copy_model(target, self.source, self.target)


@dataclass(frozen=True)
class SplitCluster(ReplaceModel):
    """Cluster ``target`` restarts as a copy of cluster ``source``'s global model and takes the
    fraction ``to_target`` [n] of each of ``clients`` [n]'s ω and label-sum mass on ``source``;
    every client's local-optimizer state for ``target`` restarts (a dead cluster re-seeded)."""

    target: int
    source: int
    clients: Tensor
    to_target: Tensor
    rewrites = ("omega", "label_sums", "optimizer")

    @property
    def replaced(self) -> int:
        return self.target

    def replace(self, target: ActionTarget) -> None:
        target.client_state.split_cluster(self.source, self.target, self.clients, self.to_target)
        copy_model(target, self.source, self.target)


@dataclass(frozen=True)
class SetCentre(ReplaceModel):
    """Cluster ``cluster``'s global model becomes the flat ``vector`` (e.g. a K-means centre)."""

    cluster: int
    vector: Tensor

    @property
    def replaced(self) -> int:
        return self.cluster

    def replace(self, target: ActionTarget) -> None:
        write_flat_into(target.global_clusters[self.cluster], self.vector)


@dataclass(frozen=True)
class Reassign(ServerAction):
    """The given clients [n] get mixture weights / assignments ``omega`` [n, K]."""

    clients: Tensor
    omega: Tensor
    rewrites = ("omega",)

    def apply(self, target: ActionTarget) -> None:
        state = target.client_state
        state.omega[self.clients] = self.omega.to(state.omega.dtype)


@dataclass(frozen=True)
class SetState(ServerAction):
    """The rule's own client-store entry ``name`` (one of its ``state_entries``) becomes ``value``."""

    name: str
    value: Tensor

    @property
    def rewrites(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.name,)

    def apply(self, target: ActionTarget) -> None:
        extra = target.client_state.extra
        if self.name not in extra:
            raise KeyError(
                f"a server action set client-store entry '{self.name}', which the rule's state_entries "
                f"does not declare ({sorted(extra)})"
            )
        extra[self.name] = self.value.to(extra[self.name].dtype).clone()


@dataclass(frozen=True)
class Note(ServerAction):
    """A line for the console (rank zero), e.g. which clients moved."""

    text: str

    def apply(self, target: ActionTarget) -> None:
        target.say(self.text)
