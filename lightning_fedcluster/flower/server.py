"""The Flower server (the ServerApp's side): the library's round schedule, the K global models
and the server's client store (ω, label sums, participation, alive clusters), and each round's
aggregation through ``RoundState`` and the rule's server hooks (``engine/server.py``).

A round: sample clients with the strategy's ``RoundSchedule``, send each node holding sampled
clients the K global models, the alive clusters and log C_{y,k}; sum the nodes' float64 updates
and reports; apply them; run the rule's actions. A node that fails or does not answer within
``round_timeout`` is dropped from the round's aggregation (logged) and not asked again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine import server
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.engine.setup_checks import check_loss_growth
from lightning_fedcluster.flower import records
from lightning_fedcluster.flower.plan import check_supported

log = logging.getLogger("lightning_fedcluster.flower")


@dataclass(frozen=True)
class DataSummary:
    """What the schedule needs of the datamodule, from the nodes' descriptions."""

    num_clients: int
    train_sizes: Tensor
    batch_size: int = 1


@dataclass
class Federation:
    """The nodes and the clients each holds."""

    owner: dict[int, int]  # client -> node id
    partition: dict[int, int]  # node id -> partition id
    sizes: Tensor
    num_classes: int
    task: str
    lost: set[int] = field(default_factory=set)


def node_error(reply: Message) -> str:
    return reply.error.reason if reply.has_error() else ""


def exchange(grid: Grid, messages: list[Message], timeout: float | None) -> list[tuple[int, Message]]:
    """Send ``messages`` and return (node, reply) pairs. The node comes from the message a reply
    answers: the SuperLink itself signs the error reply of a node that went away."""
    if not messages:
        return []
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}  # ids set when pushed
    return [(node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id), r) for r in replies]


class FlowerServer:
    """Runs ``num_rounds`` rounds of ``strategy`` on the nodes of a Flower grid, on the global
    models of ``module`` (a ``ClusteredModule``)."""

    def __init__(
        self,
        strategy: Any,
        module: Any,
        num_rounds: int,
        *,
        round_timeout: float | None = None,
        min_nodes: int = 1,
        node_wait: float = 300.0,
        log_dir: str | None = None,
        collect_client_state: bool = False,
        save_path: str | None = None,
    ) -> None:
        check_supported(strategy)
        self.strategy, self.module, self.num_rounds = strategy, module, num_rounds
        self.rule = strategy.algorithm
        self.round_timeout, self.min_nodes, self.node_wait = round_timeout, min_nodes, node_wait
        self.log_dir, self.collect_client_state = log_dir, collect_client_state
        self.save_path = save_path
        self.metrics: list[dict[str, float]] = []
        self.dropped: dict[int, list[int]] = {}  # round -> clients left out of its aggregation
        self.round_seconds: list[float] = []  # wall time of each round (benchmarks)

    # -- setup ---------------------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.node_wait
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= self.min_nodes:
                return nodes
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(nodes)} Flower node(s) connected within {self.node_wait:.0f} s, fewer than "
                    f"min_nodes={self.min_nodes}: start more SuperNodes or lower min-nodes"
                )
            time.sleep(0.2)

    def describe(self, grid: Grid, nodes: list[int]) -> Federation:
        """Ask every node which clients it holds; every client of the datamodule must be held once."""
        config = ConfigRecord({"num-clusters": int(self.strategy.num_clusters)})
        messages = [Message(RecordDict({"config": config}), n, "query.describe") for n in nodes]
        replies = exchange(grid, messages, self.node_wait)  # a deployment's nodes start a process first
        owner: dict[int, int] = {}
        partition: dict[int, int] = {}
        sizes: dict[int, int] = {}
        infos = []
        for node, reply in replies:
            if reply.has_error():
                raise RuntimeError(f"Flower node {node} rejected the run: {node_error(reply)}")
            info = reply.content["node"]
            infos.append(info)
            partition[node] = int(info["partition-id"])
            for client, size in zip(info["clients"], info["sizes"], strict=True):
                if client in owner:
                    raise RuntimeError(
                        f"client {client} is held by nodes {owner[client]} and {node} (partitions "
                        f"{partition[owner[client]]} and {partition[node]}): give every SuperNode its own "
                        "partition-id"
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
        return Federation(owner, partition, size_tensor, int(infos[0]["num-classes"]), str(infos[0]["task"]))

    # -- rounds --------------------------------------------------------------------------------
    def run(self, grid: Grid) -> Any:
        """Every round on the grid; returns the module with the trained global models and the
        server's client store (plus the nodes' stores with ``collect_client_state``)."""
        module, strategy, rule = self.module, self.strategy, self.rule
        federation = self.describe(grid, self.wait_for_nodes(grid))
        summary = DataSummary(len(federation.sizes), federation.sizes, 1)
        schedule = strategy.round_schedule(summary)
        state = ClientState.initial(summary.num_clients, federation.num_classes, strategy.num_clusters)
        state.active = rule.initial_active()
        module.client_state, module.task = state, federation.task
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), federation.sizes.cumsum(0)])
        writer = writer_for(self.log_dir)
        first_loss: float | None = None
        for round_index in range(self.num_rounds):
            started = time.perf_counter()
            clients = schedule.clients(round_index)
            round_state = RoundState(
                round_index, clients, federation.sizes[clients], module.copies.snapshot(), rule, state,
                federation.num_classes, 0, torch.device("cpu"),
            )  # fmt: skip
            self.train_round(grid, federation, round_state, state)
            round_state.apply(strategy.server_lr)
            server.record_round(rule, state, round_state, offsets)
            actions = rule.after_round(state, server.round_outcome(round_state, federation.sizes))
            for action in actions:
                if not isinstance(action, (RemoveClusters, Note)):
                    raise NotImplementedError(
                        f"the Flower server cannot carry out {type(action).__name__} yet"
                    )
            server.apply_actions(actions, state, round_state.global_clusters, rule, log.info)
            module.copies.load((round_state.global_clusters, round_state.global_shared))
            metrics = server.round_metrics(round_state, state, federation.task)
            first_loss = check_loss_growth(first_loss, metrics["train/loss"], round_index)
            self.metrics.append(metrics)
            self.round_seconds.append(time.perf_counter() - started)
            module.round_metrics = metrics
            if writer is not None:
                for name, value in metrics.items():
                    writer.add_scalar(name, value, round_index + 1)
                writer.flush()
            log.info("round %d: %s", round_index, {k: round(v, 4) for k, v in metrics.items()})
        if writer is not None:
            writer.close()
        if self.collect_client_state:
            self.collect(grid, federation, state, offsets)
        if self.save_path:
            self.save(self.save_path)
        return module

    def save(self, path: str) -> None:
        """The global models, the server's client store, the round metrics and the dropped clients."""
        torch.save(
            {
                "state_dict": self.module.state_dict(),
                "client_state": self.module.client_state.state_dict(),
                "metrics": self.metrics,
                "dropped": self.dropped,
            },
            path,
        )

    def round_content(
        self, round_index: int, clients: list[int], round_state: RoundState, state: ClientState
    ) -> RecordDict:
        config = ConfigRecord(
            {"round": round_index, "clients": clients, "num-clusters": int(self.strategy.num_clusters)}
        )
        info = {"active": state.active}
        stats = self.rule.log_label_stats(state)
        if stats is not None:
            info["log_label_stats"] = stats
        globals_ = records.snapshot_tensors((round_state.global_clusters, round_state.global_shared))
        return RecordDict(
            {"config": config, "globals": records.to_record(globals_), "server": records.to_record(info)}
        )

    def train_round(
        self, grid: Grid, federation: Federation, round_state: RoundState, state: ClientState
    ) -> None:
        """Send the round to the nodes holding its clients and sum what comes back."""
        slots: dict[int, int] = {int(c): s for s, c in enumerate(round_state.clients.tolist())}
        by_node: dict[int, list[int]] = {}
        for client in slots:
            by_node.setdefault(federation.owner[client], []).append(client)
        lost = {n: cs for n, cs in by_node.items() if n in federation.lost}
        for node, clients in lost.items():
            self.dropped.setdefault(round_state.round_index, []).extend(clients)
            log.warning(
                "round %d: node %d (partition %d) was lost earlier; its clients %s are left out",
                round_state.round_index, node, federation.partition[node], clients,
            )  # fmt: skip
        messages = [
            Message(self.round_content(round_state.round_index, cs, round_state, state), n, "train",
                    group_id=str(round_state.round_index))
            for n, cs in by_node.items() if n not in federation.lost
        ]  # fmt: skip
        answered = set()
        for node, reply in exchange(grid, messages, self.round_timeout):
            answered.add(node)
            if reply.has_error():
                self.drop(federation, node, by_node[node], round_state.round_index, node_error(reply))
                continue
            merge(round_state, reply.content, slots)
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in answered:
                reason = f"no reply within round_timeout={self.round_timeout} s"
                self.drop(federation, node, by_node[node], round_state.round_index, reason)

    def drop(
        self, federation: Federation, node: int, clients: list[int], round_index: int, reason: str
    ) -> None:
        federation.lost.add(node)
        self.dropped.setdefault(round_index, []).extend(clients)
        log.warning(
            "round %d: node %d (partition %d) failed (%s); its clients %s are dropped from this round's "
            "aggregation",
            round_index, node, federation.partition[node], reason, clients,
        )  # fmt: skip

    def collect(self, grid: Grid, federation: Federation, state: ClientState, offsets: Tensor) -> None:
        """Every node's client store into the server's (``collect_client_state``: simulation)."""
        nodes = sorted(set(federation.owner.values()) - federation.lost)
        active = records.to_record({"active": state.active})
        messages = [Message(RecordDict({"server": active}), n, "query.export") for n in nodes]
        for node, reply in exchange(grid, messages, self.round_timeout):
            if reply.has_error():
                log.warning("node %d could not export its client store: %s", node, node_error(reply))
                continue
            stored = records.from_record(reply.content["store"])
            clients = records.from_record(reply.content["node"])["clients"]
            merge_store(self.rule, state, stored, clients, offsets)


def merge(round_state: RoundState, content: RecordDict, slots: dict[int, int]) -> None:
    """A node's summed updates and its clients' reports into the round's sums."""
    update = records.from_record(content["update"])
    deltas, shared = records.tensors_snapshot(update, len(round_state.delta_sum))
    for k, tensors in enumerate(deltas):
        for i, t in enumerate(tensors):
            round_state.delta_sum[k][i].add_(t.to(round_state.delta_sum[k][i]))
    for i, t in enumerate(shared):
        round_state.delta_shared[i].add_(t.to(round_state.delta_shared[i]))
    report = records.from_record(content["report"])
    buffer = round_state.report
    buffer["weights"].add_(report["weights"].to(buffer.flat))
    buffer["metrics"].add_(report["metrics"].to(buffer.flat))
    for row, client in enumerate(report["clients"].tolist()):
        slot = slots[int(client)]
        buffer["omega"][slot] = report["omega"][row]
        buffer["label_sums"][slot] = report["label_sums"][row]
        buffer["reported"][slot] = 1.0


def merge_store(
    rule: Any, state: ClientState, stored: dict[str, Tensor], clients: Tensor, offsets: Tensor
) -> None:
    """A node's client store (its clients' rows; per-sample rows: their samples in order) into
    the full store ``state`` (``offsets``: every client's training rows)."""
    rows = clients.tolist()
    state.omega[clients] = stored["omega"]
    state.label_sums[clients] = stored["label_sums"]
    state.seen[clients] = stored["seen"]
    sizes = offsets[1:] - offsets[:-1]
    local = torch.cat([torch.zeros(1, dtype=torch.long), sizes[clients].cumsum(0)])
    for name, initial in rule.initial_extra(state.num_clients, int(offsets[-1])).items():
        target = state.extra.setdefault(name, initial)
        value = stored.get(f"extra.{name}")
        if value is None:
            continue
        if name in rule.per_sample_state:
            for r, client in enumerate(rows):
                target[int(offsets[client]) : int(offsets[client + 1])] = value[
                    int(local[r]) : int(local[r + 1])
                ]
        elif target.dim() > 0:
            target[clients] = value
    if "optimizer.ids" in stored:
        for row, vector in zip(stored["optimizer.ids"].tolist(), stored["optimizer.vectors"], strict=True):
            state.optimizer[rows[row]] = vector.clone()
        state.optimizer_started[clients] = stored["optimizer.started"]


def writer_for(log_dir: str | None) -> Any:
    if log_dir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)
