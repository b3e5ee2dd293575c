"""Tensors in and out of Flower records: the K global models, a node's summed updates and
reports, and a node's client store (kept in ``context.state``)."""

from __future__ import annotations

import json
import math

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import Snapshot

PAYLOAD, SHARED = "payload", "shared"
Record = ConfigRecord | ArrayRecord  # one encoded payload: bytes up to a chunk, else a chunked array
HEADER_BYTES = 8  # the header's length, a little-endian uint64, before the JSON header


def encode(sections: dict[str, dict[str, Tensor]]) -> Tensor:
    """Named tensors of any dtypes, in named sections, as one uint8 tensor: the header's length,
    a JSON header (section, name, dtype, shape, byte offset of every tensor) and the raw bytes.
    Values, dtypes and shapes come back bit for bit."""
    layout, parts, offset = [], [], 0
    for section, tensors in sections.items():
        for name, tensor in tensors.items():
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
            dtype = str(tensor.dtype).removeprefix("torch.")
            layout.append([section, name, dtype, list(tensor.shape), offset])
            parts.append(raw)
            offset += raw.numel()
    header = json.dumps(layout).encode()
    length = torch.tensor([len(header)], dtype=torch.int64).view(torch.uint8)
    return torch.cat([length, torch.frombuffer(bytearray(header), dtype=torch.uint8), *parts])


def decode(payload: Tensor) -> dict[str, dict[str, Tensor]]:
    """The inverse of ``encode``: each tensor is a fresh copy (aligned for its dtype)."""
    length = int(payload[:HEADER_BYTES].clone().view(torch.int64))
    layout = json.loads(bytes(payload[HEADER_BYTES : HEADER_BYTES + length].numpy()).decode())
    data = payload[HEADER_BYTES + length :]
    sections: dict[str, dict[str, Tensor]] = {}
    for section, name, dtype, shape, offset in layout:
        kind = getattr(torch, dtype)
        size = math.prod(shape) * torch.empty(0, dtype=kind).element_size()
        tensor = data[offset : offset + size].clone().view(kind).reshape(shape)
        sections.setdefault(section, {})[name] = tensor
    return sections


def to_record(tensors: dict[str, Tensor]) -> ArrayRecord:
    """Tensors as an ArrayRecord of one array (``encode``): a deployment moves every array of a
    message as its own object, one request per hop, so a record costs one object, not one per
    tensor or dtype."""
    return ArrayRecord({PAYLOAD: encode({"": tensors})})


def from_record(record: ArrayRecord) -> dict[str, Tensor]:
    return decode(torch.from_numpy(record[PAYLOAD].numpy())).get("", {})


def pack(sections: dict[str, dict[str, Tensor]], shared: Record | None = None) -> RecordDict:
    """A message's content: its sections (the server's entries, the round's configuration; a
    node's updates and reports) encoded into one record, plus ``shared``, a record made once by
    ``share`` (the K models) and put in every node's message, which Flower then pushes once for all
    nodes. A deployment moves every object of a message in its own request per hop, so each record
    is one object (bytes in a ConfigRecord) up to Flower's array chunk size, and an ArrayRecord of
    one array, chunked by Flower, above it: three or four objects a message instead of several per
    tensor."""
    content = RecordDict({PAYLOAD: one_record(encode(sections))})
    if shared is not None:
        content[SHARED] = shared
    return content


def share(sections: dict[str, dict[str, Tensor]]) -> Record:
    """Sections that several messages carry (the K models), encoded once for ``pack``."""
    return one_record(encode(sections))


def unpack(content: RecordDict) -> dict[str, dict[str, Tensor]]:
    """The sections of a message packed by ``pack``."""
    sections: dict[str, dict[str, Tensor]] = {}
    for key in (SHARED, PAYLOAD):
        if key in content:
            sections.update(decode(payload_of(content[key])))
    return sections


def one_record(payload: Tensor) -> Record:
    if payload.numel() <= FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE:
        return ConfigRecord({PAYLOAD: payload.numpy().tobytes()})
    return ArrayRecord({PAYLOAD: payload})


def payload_of(record: Record) -> Tensor:
    if isinstance(record, ConfigRecord):
        return torch.frombuffer(bytearray(record[PAYLOAD]), dtype=torch.uint8)
    return torch.from_numpy(record[PAYLOAD].numpy())


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
