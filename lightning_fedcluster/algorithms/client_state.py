"""Per-client state that persists across rounds: plain tensors.

One store for all clients: ω, label sums and participation (a few numbers per client), which
clusters are still alive, algorithm-specific extras (per-client or per-sample tensors, e.g. the
γ of FedRC-Adam) and, for FedSoft only, personal models kept on the CPU. Memory is
O(M·K·C + N·K) floats plus the personal models; it is checkpointed with the module, so resuming
at a round boundary is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import Tensor

REDUCTIONS = ("replace", "sum", "mean")
CLASSES = -1
"""A dimension of a ``StateEntry``'s row shape that is the label count (e.g. a C × C client
signature), resolved when the store is made (0 for regression)."""


class Scope(str, Enum):
    """What the rows of a client-store entry are: one per client [M, ...], one per training sample
    [N, ...] (every client's samples, in the datamodule's order), one per cluster [K, ...], or one
    value for the whole run (a scalar or a small tensor)."""

    CLIENT = "client"
    SAMPLE = "sample"
    CLUSTER = "cluster"
    SCALAR = "scalar"


@dataclass(frozen=True)
class StateEntry:
    """One algorithm-specific entry of the client store, declared once by its rule
    (``Algorithm.state_entries``); the engine derives from it the store's initial tensor, what a
    client's context holds, the round's report buffer, a Flower node's reply and the server's merge.

    ``shape``: the shape of one row (CLIENT, SAMPLE, CLUSTER) or of the whole value (SCALAR); a
    dimension given as ``CLASSES`` is the label count.
    ``initial``: the value every element starts at. ``reported``: clients write it during their
    turn (``context.extra[name]``: what a client leaves there is its report) and report it;
    otherwise only the server's actions (``SetState``) change it and clients read it.
    ``reduction``: how the round's reports become the stored value: "replace" (a client's own
    rows, per client or per sample), or, for a per-cluster or run-wide entry that several clients
    report, their "sum" or "mean" over the round's reporting clients (over every process and node).
    ``mixture``: each row is a distribution over the clusters (its last dimension), renormalised
    when clusters are removed (FedRC-Adam's γ).
    """

    name: str
    scope: Scope
    shape: tuple[int, ...] = ()
    initial: float = 0.0
    reported: bool = False
    reduction: str = "replace"
    mixture: bool = False
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", Scope(self.scope))
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"state entry {self.name!r}: reduction must be one of {REDUCTIONS}")
        shared = self.scope in (Scope.CLUSTER, Scope.SCALAR)
        if self.reported and shared and self.reduction == "replace":
            raise ValueError(
                f"state entry {self.name!r} is reported per {self.scope.value}: every client of a round "
                "reports it, so declare how the reports combine: reduction='sum' or 'mean'"
            )
        if not shared and self.reduction != "replace":
            raise ValueError(
                f"state entry {self.name!r} has one row per {self.scope.value}, which only that client "
                "writes: its reduction is 'replace'"
            )

    def full_shape(
        self, num_clients: int, num_samples: int, num_clusters: int, num_classes: int = 0
    ) -> tuple[int, ...]:
        rows = {
            Scope.CLIENT: (num_clients,),
            Scope.SAMPLE: (num_samples,),
            Scope.CLUSTER: (num_clusters,),
            Scope.SCALAR: (),
        }[self.scope]
        return (*rows, *(num_classes if d == CLASSES else d for d in self.shape))

    def initial_value(
        self, num_clients: int, num_samples: int, num_clusters: int, num_classes: int = 0
    ) -> Tensor:
        shape = self.full_shape(num_clients, num_samples, num_clusters, num_classes)
        return torch.full(shape, self.initial, dtype=self.dtype)


def initial_extras(
    entries: Iterable[StateEntry], num_clients: int, num_samples: int, num_clusters: int, num_classes: int = 0
) -> dict[str, Tensor]:
    """The store's initial tensor of every declared entry."""
    return {e.name: e.initial_value(num_clients, num_samples, num_clusters, num_classes) for e in entries}


@dataclass
class ClientState:
    """ω [M, K] (mixture weights or one-hot assignments, float64), label_sums [M, C, K] (latest S_i
    reported by each client), seen [M] (reported at least once), active [K] (cluster alive),
    extra {name: tensor} (the rule's own entries, each shaped by its declaration in ``entries``
    {name: StateEntry}), personal {client: flat float32 model} and, with
    ``optimizer_state="persist"``, optimizer {client: flat local-optimizer state, in
    ``optimizer_dtype``; a dict, or a file-backed mapping with ``optimizer_state_dir``} with
    optimizer_started [M, K] (whether client i's state for copy k exists)."""

    omega: Tensor
    label_sums: Tensor
    seen: Tensor
    active: Tensor = field(default_factory=lambda: torch.ones(0, dtype=torch.bool))
    extra: dict[str, Tensor] = field(default_factory=dict)
    personal: dict[int, Tensor] = field(default_factory=dict)
    optimizer: MutableMapping[int, Tensor] = field(default_factory=dict)
    optimizer_started: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))
    optimizer_dtype: torch.dtype = torch.float32
    entries: dict[str, StateEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.active.numel() != self.omega.shape[1]:
            self.active = torch.ones(self.omega.shape[1], dtype=torch.bool)
        if self.optimizer_started.shape != self.omega.shape:
            self.optimizer_started = torch.zeros(self.omega.shape, dtype=torch.bool)

    @classmethod
    def initial(
        cls,
        num_clients: int,
        num_classes: int,
        num_clusters: int,
        entries: Iterable[StateEntry] = (),
        num_samples: int = 0,
    ) -> ClientState:
        """ω uniform, no label sums, nobody seen, and the declared ``entries`` at their initial
        values (per-sample entries with ``num_samples`` rows)."""
        declared = {entry.name: entry for entry in entries}
        return cls(
            omega=torch.full((num_clients, num_clusters), 1.0 / num_clusters, dtype=torch.float64),
            label_sums=torch.zeros(num_clients, num_classes, num_clusters, dtype=torch.float64),
            seen=torch.zeros(num_clients, dtype=torch.bool),
            extra=initial_extras(declared.values(), num_clients, num_samples, num_clusters, num_classes),
            entries=declared,
        )

    @property
    def num_clients(self) -> int:
        return self.omega.shape[0]

    @property
    def num_clusters(self) -> int:
        return self.omega.shape[1]

    def record(self, clients: Tensor, omega: Tensor, label_sums: Tensor) -> None:
        """Store what the given clients reported this round."""
        self.omega[clients] = omega.to(self.omega.dtype)
        self.label_sums[clients] = label_sums.to(self.label_sums.dtype)
        self.seen[clients] = True

    def remove_clusters(self, remove: Tensor, renormalise: Sequence[str] = ()) -> None:
        """Drop clusters (adaptive K): mark them dead, zero their ω and label-sum columns and
        renormalise every client's ω over the remaining clusters, and with it the entries declared
        as mixtures (rows over the clusters that sum to 1, e.g. FedRC-Adam's γ) and any others
        named in ``renormalise``."""
        keep = self.active & ~remove
        if not bool(keep.any()):
            raise ValueError("cannot remove every cluster: at least one must stay active")
        self.active = keep
        self.omega = _renormalise(self.omega * keep, keep)
        self.label_sums = self.label_sums * keep
        mixtures = [name for name, entry in self.entries.items() if entry.mixture]
        for name in dict.fromkeys([*mixtures, *renormalise]):
            if name in self.extra:
                self.extra[name] = _renormalise(self.extra[name] * keep, keep)

    def merge_clusters(self, source: int, target: int, mixtures: Sequence[str] = ()) -> None:
        """Cluster ``source`` merges into ``target``: every client's ω and label sums on ``source``
        move to ``target``, and so do the per-sample mixtures named in ``mixtures`` (each declared
        mixture must be named), then ``source`` is removed."""
        if source == target or not bool(self.active[source] & self.active[target]):
            raise ValueError(
                f"cannot merge cluster {source} into {target}: both must be alive and different "
                f"(alive: {self.active.nonzero().flatten().tolist()})"
            )
        declared = [name for name, entry in self.entries.items() if entry.mixture and name in self.extra]
        unnamed = sorted(set(declared) - set(mixtures))
        if unnamed:
            raise ValueError(
                f"merging clusters moves the per-sample mixtures {unnamed} too: name them, e.g. "
                f"MergeClusters(target, source, mixtures={tuple(declared)!r})"
            )
        self.omega[:, target] += self.omega[:, source]
        self.label_sums[..., target] += self.label_sums[..., source]
        for name in mixtures:
            self.extra[name][:, target] += self.extra[name][:, source]
        remove = torch.zeros_like(self.active)
        remove[source] = True
        self.remove_clusters(remove, mixtures)

    def split_cluster(self, source: int, target: int, clients: Tensor, to_target: Tensor) -> None:
        """Move the fraction ``to_target`` [n] of each client's ω and label sums on ``source`` to
        ``target`` (alive from now on), and restart every client's optimizer state for ``target``."""
        fraction = to_target.to(self.omega.dtype)
        moved = self.omega[clients, source] * fraction
        self.omega[clients, target] += moved
        self.omega[clients, source] -= moved
        sums = self.label_sums[clients, :, source] * fraction.unsqueeze(1)
        self.label_sums[clients, :, target] += sums
        self.label_sums[clients, :, source] -= sums
        self.active[target] = True
        self.optimizer_started[:, target] = False

    def state_dict(self) -> dict[str, Tensor]:
        state = {
            "omega": self.omega.clone(),
            "label_sums": self.label_sums.clone(),
            "seen": self.seen.clone(),
            "active": self.active.clone(),
        }
        state.update({f"extra.{name}": value.clone() for name, value in self.extra.items()})
        for name, store in (("personal", self.personal), ("optimizer", self.optimizer)):
            if store:
                ids = sorted(store)
                state[f"{name}.ids"] = torch.tensor(ids, dtype=torch.long)
                state[f"{name}.vectors" if name == "optimizer" else "personal.models"] = torch.stack(
                    [store[i] for i in ids]
                )
        if self.optimizer:
            state["optimizer.started"] = self.optimizer_started.clone()
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in ("omega", "label_sums", "seen"):
            current, stored = getattr(self, name), state[name]
            if current.shape != stored.shape:
                raise ValueError(
                    f"checkpointed client state '{name}' has shape {tuple(stored.shape)} but this run "
                    f"expects {tuple(current.shape)}: resume with the same datamodule and num_clusters"
                )
            current.copy_(stored)
        if "active" in state:
            self.active = state["active"].clone()
        self.extra = {k.removeprefix("extra."): v.clone() for k, v in state.items() if k.startswith("extra.")}
        self.personal = {}
        if "personal.ids" in state:
            for i, model in zip(state["personal.ids"].tolist(), state["personal.models"], strict=True):
                self.personal[int(i)] = model.clone()
        self.optimizer.clear()  # keeps the store's kind (in memory or in a file)
        self.optimizer_started = torch.zeros(self.omega.shape, dtype=torch.bool)
        if "optimizer.ids" in state:
            for i, vector in zip(state["optimizer.ids"].tolist(), state["optimizer.vectors"], strict=True):
                self.optimizer[int(i)] = vector.to(self.optimizer_dtype, copy=True)
            self.optimizer_started = state["optimizer.started"].clone()


def _renormalise(rows: Tensor, keep: Tensor) -> Tensor:
    """Rows rescaled to sum to 1; a row with no mass left restarts uniform over the kept clusters."""
    total = rows.sum(-1, keepdim=True)
    uniform = (keep.to(rows.dtype) / keep.sum()).expand_as(rows)
    return torch.where(total > 0, rows / total.clamp_min(torch.finfo(rows.dtype).tiny), uniform)
