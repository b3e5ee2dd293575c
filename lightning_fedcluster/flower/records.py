"""Tensors in and out of Flower records: the K global models, a node's summed updates and
reports, and a node's client store (kept in ``context.state``)."""

from __future__ import annotations

import json
import math

import torch
from flwr.app import ArrayRecord
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import Snapshot

LAYOUT = "layout"


def to_record(tensors: dict[str, Tensor]) -> ArrayRecord:
    """Tensors as an ArrayRecord (moved to the CPU; dtypes, shapes and values kept bit for bit),
    packed as one flat array per dtype plus their layout: a deployment moves every array as
    its own object, one request per hop, so a message costs a few requests, not one per tensor."""
    groups: dict[str, list[Tensor]] = {}
    layout = []
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu()
        dtype = str(tensor.dtype).removeprefix("torch.")
        layout.append([name, dtype, list(tensor.shape)])
        groups.setdefault(dtype, []).append(tensor.reshape(-1))
    arrays = {dtype: torch.cat(parts) for dtype, parts in groups.items()}
    arrays[LAYOUT] = torch.frombuffer(bytearray(json.dumps(layout).encode()), dtype=torch.uint8)
    return ArrayRecord(arrays)


def from_record(record: ArrayRecord) -> dict[str, Tensor]:
    arrays = record.to_torch_state_dict()
    layout = json.loads(bytes(arrays.pop(LAYOUT).tolist()).decode())
    offsets = dict.fromkeys(arrays, 0)
    tensors = {}
    for name, dtype, shape in layout:
        size = math.prod(shape)
        start = offsets[dtype]
        tensors[name] = arrays[dtype][start : start + size].reshape(shape).clone()
        offsets[dtype] = start + size
    return tensors


def snapshot_tensors(snapshot: Snapshot, prefix: str = "") -> dict[str, Tensor]:
    """Per-cluster and shared tensors under ``{prefix}cluster.k.i`` / ``{prefix}shared.i``."""
    clusters, shared = snapshot
    named = {
        f"{prefix}cluster.{k}.{i}": t for k, tensors in enumerate(clusters) for i, t in enumerate(tensors)
    }
    named.update({f"{prefix}shared.{i}": t for i, t in enumerate(shared)})
    return named


def tensors_snapshot(tensors: dict[str, Tensor], num_clusters: int, prefix: str = "") -> Snapshot:
    """The inverse of ``snapshot_tensors``; fails when the record holds another number of clusters."""
    clusters: list[list[Tensor]] = [[] for _ in range(num_clusters)]
    shared: list[Tensor] = []
    found = set()
    for name in tensors:
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split(".")
        if parts[0] == "cluster":
            found.add(int(parts[1]))
    if found and found != set(range(num_clusters)):
        raise ValueError(
            f"the server sent {len(found)} cluster models but this node trains num_clusters={num_clusters}: "
            "run the server and the nodes with the same strategy (num_clusters)"
        )
    k = 0
    while f"{prefix}cluster.{k}.0" in tensors:
        i = 0
        while f"{prefix}cluster.{k}.{i}" in tensors:
            clusters[k].append(tensors[f"{prefix}cluster.{k}.{i}"])
            i += 1
        k += 1
    i = 0
    while f"{prefix}shared.{i}" in tensors:
        shared.append(tensors[f"{prefix}shared.{i}"])
        i += 1
    return clusters, shared


def state_record(state: ClientState) -> ArrayRecord:
    return to_record(state.state_dict())


def load_state(state: ClientState, record: ArrayRecord) -> ClientState:
    """``state`` (a fresh store of the right shape) filled from a stored record."""
    stored = from_record(record)
    state.load_state_dict(stored)
    return state
