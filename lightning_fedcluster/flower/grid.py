"""The Flower grid as the round's executor (``engine/federation.py``'s ``Executor``): a round's
clients are trained by the nodes that hold them.

``GridExecutor.train`` describes nodes that came back (``nodes.readmit``), restores the stores of
stale nodes (``nodes.restore_stores``), sends each node holding sampled clients the K global
models, the alive clusters, log C_{y,k}, the round's scheduled hyperparameters and the store
entries the server owns or rewrote, and merges the nodes' float64 updates and reports into the
round once they pass the server's checks (``aggregation.py``). A node that fails or does not
answer within ``round_timeout`` is dropped from the round (logged) and asked again once Flower's
``Grid`` lists it again. ``estimate`` and ``validate`` ask the nodes for an estimation pass
(FedSoft) and a validation pass; ``collect`` gathers their client stores (simulation). Log lines name rounds
1-based, as the progress lines do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.flower import records
from lightning_fedcluster.flower.aggregation import merge, merge_store, reply_problems
from lightning_fedcluster.flower.messaging import exchange, node_error
from lightning_fedcluster.flower.node_registry import Federation, readmit, restore_stores, sent_entries
from lightning_fedcluster.flower.support import round_hyperparameters

log = logging.getLogger("lightning_fedcluster.flower")


@dataclass
class GridRecords:
    """What the server records of the nodes' work (checkpointed with it): per round (counted from
    1, as the log names it), the clients left out of its aggregation (``dropped``) and those whose
    replies failed the checks (``rejected``), and the client-store entries the server's actions
    rewrote, which every later message carries (``pushed``)."""

    dropped: dict[int, list[int]] = field(default_factory=dict)
    rejected: dict[int, list[int]] = field(default_factory=dict)
    pushed: set[str] = field(default_factory=set)


class GridExecutor:
    """A round's clients trained on the nodes of ``grid`` that hold them (``federation``), from
    the server's K working copies ``copies`` and client store ``state``; ``solver`` is the
    server's copy of the local solver, whose hyperparameters the LR schedulers set each round."""

    reduce = None  # the nodes' replies make the round whole on the server

    def __init__(
        self,
        grid: Grid,
        federation: Federation,
        rule: Algorithm,
        copies: ClusterCopies,
        state: ClientState,
        solver: torch.optim.Optimizer,
        round_timeout: float | None,
        found: GridRecords,
    ) -> None:
        self.grid, self.federation, self.rule, self.copies = grid, federation, rule, copies
        self.state, self.solver, self.round_timeout, self.found = state, solver, round_timeout, found

    # -- the round's clients ---------------------------------------------------------------------
    def train(self, round_state: RoundState) -> None:
        """Send the round to the nodes holding its clients and merge what comes back."""
        federation, round_index = self.federation, round_state.round_index
        readmit(self.grid, federation, self.rule.num_clusters, self.round_timeout, round_index)
        restore_stores(self.grid, federation, self.state, self.round_timeout)
        slots: dict[int, int] = {int(c): s for s, c in enumerate(round_state.clients.tolist())}
        by_node: dict[int, list[int]] = {}
        for client in slots:
            by_node.setdefault(federation.owner[client], []).append(client)
        for node, clients in by_node.items():
            if node in federation.lost:
                self.found.dropped.setdefault(round_index + 1, []).extend(clients)
                log.warning(
                    "round %d: node %d (partition %d) was lost earlier; its clients %s are left out",
                    round_index + 1, node, federation.partition[node], clients,
                )  # fmt: skip
        models = self.models_record((round_state.global_clusters, round_state.global_shared))
        messages = [
            Message(self.round_content(round_state, cs, models), n, "train", group_id=str(round_index))
            for n, cs in by_node.items() if n not in federation.lost
        ]  # fmt: skip
        answered = set()
        for node, reply in exchange(self.grid, messages, self.round_timeout):
            answered.add(node)
            if reply.has_error():
                self.drop(node, by_node[node], round_index, node_error(reply))
                continue
            try:
                sections = records.unpack(reply.content)
                problems = reply_problems(round_state, sections, by_node[node])
            except (KeyError, ValueError, TypeError, RuntimeError) as error:  # not a payload of records.pack
                problems = [f"it cannot be decoded ({type(error).__name__}: {error})"]
            if problems:
                sender = f"node {node} (partition {federation.partition[node]}, clients {by_node[node]})"
                round_state.reject([slots[c] for c in by_node[node]], sender, problems)
                federation.stale.add(node)  # its store holds the rejected round: restored before its next
                continue
            merge(round_state, sections, slots)
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in answered:
                reason = f"no reply within round_timeout={self.round_timeout} s"
                self.drop(node, by_node[node], round_index, reason)

    def round_content(
        self, round_state: RoundState, clients: list[int], models: records.Record
    ) -> RecordDict:
        config = {
            "round": torch.tensor(round_state.round_index),
            "clients": torch.tensor(clients, dtype=torch.long),
            "num-clusters": torch.tensor(int(self.rule.num_clusters)),
        }
        info = round_hyperparameters(self.solver)
        if round_state.membership is not None:
            info["membership"] = round_state.membership
        info.update(sent_entries(self.state, clients, self.found.pushed))
        return records.pack({"server": self.server_entries(info), "config": config}, models)

    def drop(self, node: int, clients: list[int], round_index: int, reason: str) -> None:
        self.federation.lost.add(node)
        self.found.dropped.setdefault(round_index + 1, []).extend(clients)
        log.warning(
            "round %d: node %d (partition %d) failed (%s); its clients %s are dropped from this round's "
            "aggregation",
            round_index + 1, node, self.federation.partition[node], reason, clients,
        )  # fmt: skip

    # -- passes over every client ----------------------------------------------------------------
    def estimate(self, round_index: int, state: ClientState) -> Tensor:
        """An estimation pass (FedSoft's importance): every node scores its clients' training data
        under the K global models. The clients of a node that fails get uniform estimates over the
        alive clusters (logged), as a client that was never estimated has."""
        content = records.pack({"server": self.server_entries()}, self.models_record())
        nodes = self.federation.live_nodes()
        messages = [Message(content, n, "query.estimate", group_id=f"estimate.{round_index}") for n in nodes]
        estimates = torch.full((state.num_clients, state.num_clusters), float("nan"), dtype=torch.float64)
        for node, reply in exchange(self.grid, messages, self.round_timeout):
            if reply.has_error():
                self.federation.lost.add(node)
                log.warning(
                    "round %d: node %d failed its estimation pass (%s)",
                    round_index + 1,
                    node,
                    node_error(reply),
                )
                continue
            found = records.unpack(reply.content)["estimates"]
            estimates[found["clients"]] = found["estimates"].to(torch.float64)
        missing = estimates.isnan().any(1)
        if bool(missing.any()):
            estimates[missing] = state.active.to(torch.float64) / state.active.sum()
            log.warning(
                "round %d: no estimate for clients %s (their node is lost); they get uniform estimates",
                round_index + 1, missing.nonzero().flatten().tolist(),
            )  # fmt: skip
        return estimates

    def validate(self) -> dict[str, float]:
        """A validation pass on the nodes (each client's validation rows under its own ω or
        personal model): ``val/local_acc`` (``val/local_mse``) over every answering node's rows.
        Each node gets the entries the server holds for its clients (ω after a merge or a
        reassignment), as a round's message does for its sampled clients."""
        models = self.models_record()
        messages = []
        for node in self.federation.live_nodes():
            clients = self.federation.clients_of(node)
            sections = {
                "server": self.server_entries(sent_entries(self.state, clients, self.found.pushed)),
                "config": {"clients": torch.tensor(clients, dtype=torch.long)},
            }
            messages.append(Message(records.pack(sections, models), node, "query.evaluate"))
        sums = torch.zeros(2, dtype=torch.float64)
        for node, reply in exchange(self.grid, messages, self.round_timeout):
            if reply.has_error():
                log.warning("node %d could not evaluate its clients: %s", node, node_error(reply))
                continue
            sums += records.unpack(reply.content)["evaluation"]["sums"]
        name = f"val/local_{self.federation.task.metric}"
        return {name: float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")}

    def collect(self) -> None:
        """Every node's client store into the server's (``collect_client_state``: simulation)."""
        content = {"server": {"active": self.state.active}}
        messages = [Message(records.pack(content), n, "query.export") for n in self.federation.live_nodes()]
        for node, reply in exchange(self.grid, messages, self.round_timeout):
            if reply.has_error():
                log.warning("node %d could not export its client store: %s", node, node_error(reply))
                continue
            sections = records.unpack(reply.content)
            stored, clients = sections["store"], sections["node"]["clients"]
            merge_store(self.rule, self.state, stored, clients, self.federation.offsets, self.found.pushed)

    # -- what every message carries --------------------------------------------------------------
    def models_record(self, snapshot: Any = None) -> records.Record:
        """The K global models (``snapshot``, the working copies by default) as one record, encoded
        once and shared by every node's message."""
        snapshot = self.copies.snapshot() if snapshot is None else snapshot
        return records.share({"globals": records.snapshot_tensors(snapshot)})

    def server_entries(self, extra: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The alive clusters, log C_{y,k} (FedRC) and ``extra`` entries: what every message to the
        nodes carries besides the models."""
        info: dict[str, Tensor] = {"active": self.state.active, **(extra or {})}
        stats = label_statistics(self.rule, self.state)
        if stats is not None:
            info["log_label_stats"] = stats
        return info
