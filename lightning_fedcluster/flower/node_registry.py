"""The nodes of a Flower run: which node holds which clients (from the nodes' descriptions),
nodes lost or refused, and nodes that come back.

A node that fails, misses ``round-timeout`` or sends a rejected reply leaves that round; a lost
node, or a new one (a restarted SuperNode), that the Flower grid lists again is described again at the
next round's start and, when it claims the partition of a lost node with the same clients, takes
that partition over from that round on. A node claiming a partition that a live node holds is
refused (named once) and the run goes on without it. Before a returning or rejected node trains
again, the server restores its clients' rows of the client store (ω, label sums, participation
and the per-client entries the server holds), so that it goes on as if it had not taken part in
the rounds it missed, as its clients' entries in the server's store say.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.flower import records
from lightning_fedcluster.flower.messaging import exchange, node_error

log = logging.getLogger("lightning_fedcluster.flower")


@dataclass
class Federation:
    """The nodes and the clients each holds."""

    owner: dict[int, int]  # client -> node id
    partition: dict[int, int]  # node id -> partition id
    sizes: Tensor
    num_classes: int
    task: Task
    lost: set[int] = field(default_factory=set)  # nodes not asked until they come back
    refused: dict[int, int] = field(default_factory=dict)  # node -> the node holding its partition
    stale: set[int] = field(default_factory=set)  # nodes whose client stores the server must restore

    @property
    def offsets(self) -> Tensor:
        return torch.cat([torch.zeros(1, dtype=torch.long), self.sizes.cumsum(0)])

    def clients_of(self, node: int) -> list[int]:
        return sorted(c for c, n in self.owner.items() if n == node)

    def live_nodes(self) -> list[int]:
        return sorted(set(self.owner.values()) - self.lost)


def describe_messages(nodes: list[int], num_clusters: int) -> list[Message]:
    config = ConfigRecord({"num-clusters": int(num_clusters)})
    return [Message(RecordDict({"config": config}), n, "query.describe") for n in nodes]


def federation_of(replies: list[tuple[int, Message]], nodes: list[int]) -> Federation:
    """The federation from the nodes' descriptions; every client of the datamodule must be held.
    A node claiming a partition that another node (the lowest id) claims too is refused."""
    owner: dict[int, int] = {}
    partition: dict[int, int] = {}
    sizes: dict[int, int] = {}
    infos: list[Any] = []
    refused: dict[int, int] = {}
    for node, reply in sorted(replies, key=lambda pair: pair[0]):
        if reply.has_error():
            raise RuntimeError(f"Flower node {node} rejected the run: {node_error(reply)}")
        info = reply.content["node"]
        claimed = int(info["partition-id"])
        holder = next((n for n, p in partition.items() if p == claimed), None)
        if holder is not None:
            refuse(node, claimed, holder, refused)
            continue
        infos.append(info)
        partition[node] = claimed
        for client, size in zip(info["clients"], info["sizes"], strict=True):
            if client in owner:
                raise RuntimeError(
                    f"client {client} is held by nodes {owner[client]} and {node} (partitions "
                    f"{partition[owner[client]]} and {claimed}): give every SuperNode its own partition-id "
                    "of the same num-partitions"
                )
            owner[client], sizes[client] = node, size
    if len(replies) < len(nodes):
        raise RuntimeError(f"{len(nodes) - len(replies)} Flower node(s) did not describe their clients")
    num_clients = int(infos[0]["num-clients"])
    missing = sorted(set(range(num_clients)) - set(owner))
    if missing:
        raise RuntimeError(
            f"no connected node holds clients {missing} of {num_clients}: start a SuperNode for every "
            f"partition (connected partitions: {sorted(partition.values())})"
        )
    size_tensor = torch.tensor([sizes[c] for c in range(num_clients)], dtype=torch.long)
    classes, task = int(infos[0]["num-classes"]), Task.of(str(infos[0]["task"]))
    federation = Federation(owner, partition, size_tensor, classes, task)
    federation.refused = refused
    return federation


def refuse(node: int, claimed: int, holder: int, refused: dict[int, int]) -> None:
    """Leave ``node`` out while ``holder`` holds its partition (said once per holder)."""
    if refused.get(node) == holder:
        return
    refused[node] = holder
    log.warning(
        "node %d claims partition %d, which node %d holds: node %d is not used in this run (give every "
        "SuperNode its own partition-id)", node, claimed, holder, node,
    )  # fmt: skip


def readmit(
    grid: Grid, federation: Federation, num_clusters: int, timeout: float | None, round_index: int
) -> None:
    """Lost nodes that ``grid`` lists again, and new ones, described again: a node claiming a lost
    node's partition (its clients) takes it over from this round on; one claiming a live node's
    partition is refused."""
    known = set(federation.partition) - federation.lost
    waiting = {n for n, holder in federation.refused.items() if holder not in federation.lost}
    candidates = sorted(set(grid.get_node_ids()) - known - waiting)
    if not candidates:
        return
    for node, reply in exchange(grid, describe_messages(candidates, num_clusters), timeout):
        if reply.has_error():
            continue  # still away (or not this run's node): asked again next round
        info = reply.content["node"]
        claimed, clients = int(info["partition-id"]), sorted(int(c) for c in info["clients"])
        holders = [n for n, p in federation.partition.items() if p == claimed and n != node]
        live = [n for n in holders if n not in federation.lost]
        if live:
            refuse(node, claimed, live[0], federation.refused)
            continue
        previous = holders[0] if holders else node
        if clients != federation.clients_of(previous):
            log.warning(
                "node %d claims partition %d with clients %s, but that partition's clients are %s: it is not "
                "used (start it with the run's num-partitions)", node, claimed, clients,
                federation.clients_of(previous),
            )  # fmt: skip
            federation.refused[node] = -1  # never: another datamodule split
            continue
        federation.refused.pop(node, None)
        for stale in holders:
            federation.partition.pop(stale, None)
        federation.partition[node] = claimed
        for client in clients:
            federation.owner[client] = node
        federation.lost.discard(node)
        federation.stale.add(node)
        log.info(
            "round %d: node %d (partition %d) is back; its clients %s train again from this round",
            round_index + 1, node, claimed, clients,
        )  # fmt: skip


def store_rows(state: ClientState, clients: list[int]) -> dict[str, Tensor]:
    """The server's client-store rows of ``clients``: what a node's store is restored from (the
    rule's entries by their declared scope: a per-client one's rows, a per-cluster or run-wide
    one whole; per-sample ones stay on the nodes)."""
    rows = torch.tensor(clients, dtype=torch.long)
    entries = {"omega": state.omega[rows], "label_sums": state.label_sums[rows], "seen": state.seen[rows]}
    for name, value in state.extra.items():
        scope = state.entries[name].scope
        if scope != Scope.SAMPLE:
            entries[f"extra.{name}"] = value[rows] if scope == Scope.CLIENT else value
    return entries


def sent_entries(state: ClientState, clients: list[int], rewritten: set[str]) -> dict[str, Tensor]:
    """``store.<name>`` of what a message to a node carries of the server's store, by the entries'
    declarations: those the server owns (clients only read them) and the per-cluster and run-wide
    ones (the server holds the reduced value), plus ω, label sums or a client's reported rows once
    an action rewrote them (``rewritten``); a per-client entry as the rows of ``clients``."""
    names = {
        name
        for name, entry in state.entries.items()
        if entry.scope != Scope.SAMPLE and (not entry.reported or entry.scope != Scope.CLIENT)
    }
    rows = torch.tensor(clients, dtype=torch.long)
    entries: dict[str, Tensor] = {}
    for name in sorted(names | rewritten):
        if name in ("omega", "label_sums"):
            entries[f"store.{name}"] = getattr(state, name)[rows]
        elif state.entries[name].scope == Scope.CLIENT:
            entries[f"store.{name}"] = state.extra[name][rows]
        else:
            entries[f"store.{name}"] = state.extra[name]
    return entries


def restore_stores(grid: Grid, federation: Federation, state: ClientState, timeout: float | None) -> None:
    """Send every stale live node its clients' rows of the server's store (``query.restore``)."""
    nodes = sorted(federation.stale - federation.lost)
    if not nodes:
        return
    messages = []
    for node in nodes:
        clients = federation.clients_of(node)
        content = {"server": {"active": state.active}, "store": store_rows(state, clients)}
        content["node"] = {"clients": torch.tensor(clients, dtype=torch.long)}
        messages.append(Message(records.pack(content), node, "query.restore"))
    for node, reply in exchange(grid, messages, timeout):
        if reply.has_error():
            reason = node_error(reply)
            log.warning("node %d could not restore its client store (%s); it is left out", node, reason)
            continue
        federation.stale.discard(node)
    federation.lost |= federation.stale  # not restored: not asked to train until it comes back
