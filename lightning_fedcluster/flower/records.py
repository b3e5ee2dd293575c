"""Tensors in and out of Flower records: the K global models, a node's summed updates and
reports, and a node's client store (kept in ``context.state``)."""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import Snapshot


def to_record(tensors: dict[str, Tensor]) -> ArrayRecord:
    """Tensors as an ArrayRecord (moved to the CPU; dtypes and shapes kept)."""
    return ArrayRecord({name: t.detach().cpu().contiguous() for name, t in tensors.items()})


def from_record(record: ArrayRecord) -> dict[str, Tensor]:
    return {name: t.clone() for name, t in record.to_torch_state_dict().items()}


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
