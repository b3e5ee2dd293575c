"""Per-(client, cluster) optimizer state kept across rounds (``optimizer_state="persist"``), as
the FedRC authors' code keeps one SGD optimizer, momentum included, per client and cluster.

A client's state is one flat vector laid out by ``StateLayout`` (every state tensor of every
parameter of every copy, in the local optimizer's parameter order) plus a [K] flag per copy saying
whether its state exists yet (torch's SGD treats the first step without a momentum buffer
differently). Vectors live on the CPU in the client store, float32 by default or bfloat16/float16
(``optimizer_state_dtype``: half the memory, the state rounded once per round); only the client
being trained has its state on the accelerator, in the optimizer's own dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import local_optimizer

OptimizerStateMode = Literal["reset", "persist"]
StoreDtypeName = Literal["float32", "bfloat16", "float16"]
OPTIMIZER_STATES: tuple[str, ...] = get_args(OptimizerStateMode)
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
assert tuple(STORE_DTYPES) == get_args(StoreDtypeName)
REPORT_BYTES = 2**30  # print the store's size at fit start above 1 GB


@dataclass(frozen=True)
class StateEntry:
    """State tensor ``key`` of parameter ``param`` (optimizer order), which belongs to copy
    ``copy``, at ``offset:offset+numel`` of the flat vector."""

    param: int
    copy: int
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


@dataclass(frozen=True)
class StateLayout:
    entries: tuple[StateEntry, ...]
    size: int

    def copy_entries(self, k: int) -> list[StateEntry]:
        return [e for e in self.entries if e.copy == k]


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def state_layout(optimizer: torch.optim.Optimizer, copy_of: Sequence[int]) -> StateLayout:
    """The state an optimizer of this type and settings keeps per parameter, found by one step
    with zero gradients on detached clones (no parameter of the run is touched).
    ``copy_of[i]``: the cluster copy of the optimizer's i-th parameter."""
    params = optimizer_params(optimizer)
    clones = [p.detach().clone().requires_grad_(True) for p in params]
    groups, start = [], 0
    for group in optimizer.param_groups:
        count = len(group["params"])
        groups.append({**group, "params": clones[start : start + count]})
        start += count
    probe = type(optimizer)(groups, **optimizer.defaults)
    for clone in clones:
        clone.grad = torch.zeros_like(clone)
    probe.step()
    entries, offset = [], 0
    for i, clone in enumerate(clones):
        for key in sorted(probe.state.get(clone, {})):
            value = probe.state[clone][key]
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"optimizer_state='persist' stores tensor state only; {type(optimizer).__name__} keeps "
                    f"'{key}' as {type(value).__name__}: use optimizer_state='reset'"
                )
            entries.append(StateEntry(i, copy_of[i], key, tuple(value.shape), value.dtype, offset))
            offset += value.numel()
    return StateLayout(tuple(entries), offset)


def copy_index(models: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> list[int]:
    """The cluster copy of each optimizer parameter."""
    owner = {id(p): k for k, model in enumerate(models) for p in model.parameters()}
    return [owner[id(p)] for p in optimizer_params(optimizer)]


def persistent_layout(models: Sequence[nn.Module], trainer: Any = None) -> StateLayout:
    """The layout of a client's persistent state for the module's local optimizer (a fresh one,
    from the user's configure_optimizers, with ``trainer`` attached while it runs)."""
    optimizer = local_optimizer(models, trainer)
    return state_layout(optimizer, copy_index(models, optimizer))


def check_optimizer_state(optimizer_state: str, dtype: str) -> None:
    """The strategy's ``optimizer_state`` and ``optimizer_state_dtype``, refused before training."""
    if optimizer_state not in OPTIMIZER_STATES:
        raise ValueError(
            f"optimizer_state must be one of {OPTIMIZER_STATES} ('persist' keeps every (client, cluster) "
            f"optimizer state across rounds, as the FedRC authors' code does), got {optimizer_state!r}"
        )
    if dtype not in STORE_DTYPES:
        raise ValueError(
            f"optimizer_state_dtype must be one of {tuple(STORE_DTYPES)} (the dtype the persistent "
            f"optimizer state is stored in between rounds), got {dtype!r}"
        )
    if dtype != "float32" and optimizer_state != "persist":
        raise ValueError(
            f"optimizer_state_dtype={dtype!r} applies to the store of optimizer_state='persist'; "
            f"with optimizer_state={optimizer_state!r} nothing is stored: give optimizer_state='persist' "
            "or drop the dtype"
        )


def check_persist_with_shared_layers(optimizer_state: str, shared_layers: Sequence[str]) -> None:
    """``optimizer_state="persist"`` cannot keep the state of layers tied across the clusters."""
    if optimizer_state == "persist" and shared_layers:
        raise ValueError(
            "optimizer_state='persist' does not support shared_layers (a tied extractor's state would "
            "belong to every cluster at once): use optimizer_state='reset' with shared_layers"
        )


def store_state(state: ClientState, key: int, vector: Tensor, started: Tensor) -> None:
    """Client ``key``'s optimizer state after training into the store, in the store's dtype
    (``state.optimizer_dtype``): in place once the client has a vector (allocated once per client),
    or written to the store's file (``optimizer_state_dir``)."""
    if not isinstance(state.optimizer, dict):  # a file store (optimizer_state_dir): written through
        state.optimizer[key] = vector
        state.optimizer_started[key] = started
        return
    stored = state.optimizer.get(key)
    if stored is None:
        state.optimizer[key] = vector.detach().to("cpu", dtype=state.optimizer_dtype, copy=True)
    else:
        stored.copy_(vector)
    state.optimizer_started[key] = started


def report_store_size(layout: StateLayout, num_clients: int, dtype: torch.dtype = torch.float32) -> None:
    """Say once, at fit start, how large the store may grow when it exceeds 1 GB."""
    from lightning.pytorch.utilities import rank_zero_info

    total = num_clients * layout.size * dtype.itemsize
    if total > REPORT_BYTES:
        rank_zero_info(
            f"optimizer_state='persist' keeps up to {total / 2**30:.1f} GB of optimizer state on the CPU "
            f"({num_clients} clients x {layout.size:,} values)"
        )


def load_state(
    optimizer: torch.optim.Optimizer, layout: StateLayout, vector: Tensor | None, started: Tensor | None
) -> None:
    """Fresh state, then the client's stored state for every copy whose state exists (a float32
    store on the parameters' device is used in place; another dtype or device is copied)."""
    optimizer.state.clear()
    if vector is None or started is None:
        return
    params = optimizer_params(optimizer)
    for entry in layout.entries:
        if bool(started[entry.copy]):
            p = params[entry.param]
            flat = vector[entry.offset : entry.offset + entry.numel]
            optimizer.state[p][entry.key] = flat.view(entry.shape).to(device=p.device, dtype=entry.dtype)


def read_state(
    optimizer: torch.optim.Optimizer, layout: StateLayout, num_copies: int
) -> tuple[Tensor, Tensor]:
    """The flat state vector (float32, on the parameters' device) and the [K] flags of the
    copies whose state exists after training."""
    params = optimizer_params(optimizer)
    device = params[0].device if params else torch.device("cpu")
    vector = torch.zeros(layout.size, dtype=torch.float32, device=device)
    started = torch.zeros(num_copies, dtype=torch.bool)
    for entry in layout.entries:
        state = optimizer.state.get(params[entry.param])
        if state and entry.key in state:
            vector[entry.offset : entry.offset + entry.numel] = state[entry.key].detach().flatten().float()
            started[entry.copy] = True
    return vector, started


def momentum_offsets(layout: StateLayout, names: Sequence[str], num_copies: int) -> dict[str, list[int]]:
    """Per parameter name (of one copy) the offsets of its momentum buffer in each copy k: the
    vectorised executor's view of the layout (SGD's ``momentum_buffer`` only)."""
    keys = {e.key for e in layout.entries}
    if keys - {"momentum_buffer"}:
        raise ValueError(
            f"the vectorised executor persists SGD momentum only, the optimizer keeps {sorted(keys)}"
        )
    offsets: dict[str, list[int]] = {name: [] for name in names}
    for k in range(num_copies):
        entries = layout.copy_entries(k)
        if entries and len(entries) != len(names):
            raise ValueError("every parameter of a copy must keep a momentum buffer")
        for name, entry in zip(names, entries, strict=False):
            offsets[name].append(entry.offset)
    return offsets
