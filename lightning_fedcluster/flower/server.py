"""The Flower server (the ServerApp's side): the library's round schedule, the K global models
and the server's client store (ω, label sums, participation, alive clusters), and each round's
aggregation through ``RoundState`` and the rule's server hooks (``engine/server.py``).

The round's server sequence is the library's ``RoundDriver`` (``engine/federation.py``), the one
the Lightning engine runs; this module is the adapter: it sends each node holding sampled
clients the K global models, the alive clusters, log C_{y,k}, the round's scheduled lr and the
store entries the server owns, sums the nodes' float64 updates and reports into the round, and
asks the nodes for estimation (FedSoft) and validation passes. A node that fails or does not
answer within ``round_timeout`` is dropped from the round's aggregation (logged), and asked again
once the grid lists it again (``nodes.py``); replies are checked before they are merged
(``engine/reply_checks.py``) and the server's state is checkpointed for ``resume``
(``server_state.py``). Log lines name rounds 1-based, as the progress lines do ("round 3/10").
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.engine.federation import (
    ClientDirectory,
    RoundDriver,
    ServerState,
    initial_client_state,
)
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.engine.server_optimizer import ServerOptimizer
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.engine.verified_files import save_verified
from lightning_fedcluster.flower import records
from lightning_fedcluster.flower.aggregation import merge, merge_store, reply_problems
from lightning_fedcluster.flower.messaging import exchange, node_error, wait_for_nodes
from lightning_fedcluster.flower.nodes import (
    Federation,
    describe_messages,
    federation_of,
    readmit,
    restore_stores,
    sent_entries,
)
from lightning_fedcluster.flower.plan import check_supported, round_hyperparameters, server_schedulers
from lightning_fedcluster.flower.reporting import console_logging, progress_line, writer_for
from lightning_fedcluster.flower.server_state import resume_from, save_checkpoint
from lightning_fedcluster.metrics.undefined import warn_nan_metrics

NO_NODE_ROWS = "no node that answered has validation rows (or none answered: see the warnings above)"
log = logging.getLogger("lightning_fedcluster.flower")


@dataclass(frozen=True)
class DataSummary:
    """What the schedule needs of the datamodule, from the nodes' descriptions."""

    num_clients: int
    train_sizes: Tensor
    batch_size: int = 1


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
        eval_every: int | None = None,
        checkpoint_path: str | None = None,
        checkpoint_every: int = 1,
        resume: bool = False,
    ) -> None:
        check_supported(strategy)
        self.strategy, self.module, self.num_rounds = strategy, module, num_rounds
        self.plan = strategy.plan
        self.rule = self.plan.rule
        self.round_timeout, self.min_nodes, self.node_wait = round_timeout, min_nodes, node_wait
        self.log_dir, self.collect_client_state = log_dir, collect_client_state
        self.save_path, self.eval_every = save_path, eval_every
        self.checkpoint_path, self.checkpoint_every, self.resume = checkpoint_path, checkpoint_every, resume
        self.metrics: list[dict[str, float]] = []
        self.dropped: dict[int, list[int]] = {}  # round -> clients left out of its aggregation
        self.rejected: dict[int, list[int]] = {}  # round -> clients whose replies failed the checks
        self.round_seconds: list[float] = []  # wall time of each round (benchmarks)
        self.solver: Any = None  # the server's copy of the local solver, which the schedulers step
        config = self.plan.server_optimizer
        self.server_optimizer = None if config.kind == "none" else ServerOptimizer(config)
        # Client-store entries the server's actions own (FedSoft's importance): sent to the nodes.
        self.pushed: set[str] = set()

    # -- setup ---------------------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        return wait_for_nodes(grid, self.min_nodes, self.node_wait)

    def describe(self, grid: Grid, nodes: list[int]) -> Federation:
        """Ask every node which clients it holds; every client of the datamodule must be held once
        (a node claiming a partition another node holds is refused, and the run goes on)."""
        messages = describe_messages(nodes, self.strategy.num_clusters)
        replies = exchange(grid, messages, self.node_wait)  # a deployment's nodes start a process first
        return federation_of(replies, nodes)

    # -- rounds --------------------------------------------------------------------------------
    def run(self, grid: Grid) -> Any:
        """Every round on the grid (the library's ``RoundDriver`` runs the server's side; the nodes
        do the clients' work); returns the module with the trained global models and the server's
        client store (plus the nodes' stores with ``collect_client_state``)."""
        console_logging()
        if self.save_path and os.path.exists(self.save_path):
            log.warning(
                "save-path %s exists (an earlier run's); this run overwrites it after its last round: "
                "give each run its own save-path to keep both",
                self.save_path,
            )
        try:
            return self.rounds(grid)
        except Exception as error:  # the last line of the stream; Flower puts it in the run's status
            log.error("run failed: %s: %s", type(error).__name__, error)
            raise

    def rounds(self, grid: Grid) -> Any:
        module, strategy, plan = self.module, self.strategy, self.plan
        federation = self.describe(grid, self.wait_for_nodes(grid))
        num_clients = len(federation.sizes)
        # Per-sample state (FedRC-Adam γ) stays on the nodes; the server keeps per-client entries.
        state = initial_client_state(plan, num_clients, federation.num_classes, 0, per_sample=False)
        module.client_state, module.task = state, federation.task
        # The user's LR schedulers step here, once per round; the nodes get each round's values.
        self.solver, schedulers = server_schedulers(module.models, federation.task)
        summary = DataSummary(num_clients, federation.sizes, 1)
        driver = RoundDriver(
            plan,
            ServerState(module.copies, state, self.server_optimizer, schedulers),
            strategy.round_schedule(summary, client_state=lambda: state),
            ClientDirectory(federation.sizes, federation.num_classes, federation.task),
            estimate=lambda round_index: self.estimate(grid, federation, state, round_index),
            personal_vectors=False,  # personal models stay on the nodes
            num_rounds=self.num_rounds,
            say=log.info,
            warn=log.warning,
            check_action=lambda action: self.check_action(action, state),
        )
        writer = writer_for(self.log_dir)
        start = self.start(driver, federation)
        for round_index in range(start, self.num_rounds):
            started = time.perf_counter()
            readmit(grid, federation, self.strategy.num_clusters, self.round_timeout, round_index)
            restore_stores(grid, federation, state, self.round_timeout)
            round_state = driver.begin_round(round_index)
            self.train_round(grid, federation, round_state, state)
            metrics = driver.end_round(round_state)
            rejected = round_state.clients[(round_state.report["rejected"] > 0).cpu()].tolist()
            if rejected:
                self.rejected[round_index] = rejected
            if self.eval_every and (
                (round_index + 1) % self.eval_every == 0 or round_index + 1 == self.num_rounds
            ):
                metrics.update(self.evaluate(grid, federation, state))
            warn_nan_metrics(metrics, {f"val/local_{Task.of(federation.task).metric}": NO_NODE_ROWS})
            self.metrics.append(metrics)
            self.round_seconds.append(time.perf_counter() - started)
            module.round_metrics, module.rounds_trained = metrics, round_index + 1
            if writer is not None:
                for name, value in metrics.items():
                    writer.add_scalar(name, value, round_index + 1)
                writer.flush()
            log.info(progress_line(round_index, self.num_rounds, metrics, self.round_seconds[-1]))
            last = round_index + 1 == self.num_rounds
            if self.checkpoint_path and ((round_index + 1) % self.checkpoint_every == 0 or last):
                save_checkpoint(self, driver, round_index, self.checkpoint_path)
        if writer is not None:
            writer.close()
        if self.collect_client_state:
            self.collect(grid, federation, state, federation.offsets)
        if self.save_path:
            self.save(self.save_path)
        return module

    def start(self, driver: RoundDriver, federation: Federation) -> int:
        """The first round to run: after the checkpoint's (``resume`` with a checkpoint there: every
        node's store is restored from the server's before it), else 0 (prepared here)."""
        if self.resume and self.checkpoint_path and Path(self.checkpoint_path).exists():
            federation.stale |= set(federation.live_nodes())
            self.module.rounds_trained = resume_from(self, driver, self.checkpoint_path)
            return self.module.rounds_trained
        if self.resume:
            log.info("resume: no checkpoint at %s yet, so the run starts from round 1", self.checkpoint_path)
        driver.prepare_round(0)
        return 0

    def check_action(self, action: ServerAction, state: ClientState) -> None:
        """Before a rule's action applies: the client-store entries it rewrites (ω, label sums, the
        rule's per-client and run-wide entries) go to the nodes with every later round; entries
        the nodes alone hold (per-sample state, persistent optimizer state) cannot be rewritten by
        the server yet, and an action that would is refused by name."""
        pushable = {"omega", "label_sums"}
        pushable |= {name for name in state.extra if state.entries[name].scope != Scope.SAMPLE}
        for name in action.rewrites:
            if name == "optimizer" and not self.plan.persists_optimizer_state:
                continue  # the nodes keep no optimizer state between rounds: nothing to restart
            if name not in pushable:
                raise NotImplementedError(
                    f"the Flower server cannot carry out {type(action).__name__} yet: it rewrites the "
                    f"clients' {name!r}, which the nodes hold"
                )
            self.pushed.add(name)

    def estimate(self, grid: Grid, federation: Federation, state: ClientState, round_index: int) -> Tensor:
        """An estimation pass (FedSoft's importance): every node scores its clients' training data
        under the K global models. The clients of a node that fails get uniform estimates over the
        alive clusters (logged), as a client that was never estimated has."""
        content = records.pack({"server": self.server_entries(state)}, self.models_record())
        nodes = sorted(set(federation.owner.values()) - federation.lost)
        messages = [Message(content, n, "query.estimate", group_id=f"estimate.{round_index}") for n in nodes]
        estimates = torch.full((state.num_clients, state.num_clusters), float("nan"), dtype=torch.float64)
        for node, reply in exchange(grid, messages, self.round_timeout):
            if reply.has_error():
                federation.lost.add(node)
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
            uniform = state.active.to(torch.float64) / state.active.sum()
            estimates[missing] = uniform
            log.warning(
                "round %d: no estimate for clients %s (their node is lost); they get uniform estimates",
                round_index + 1, missing.nonzero().flatten().tolist(),
            )  # fmt: skip
        return estimates

    def models_record(self, snapshot: Any = None) -> records.Record:
        """The K global models (``snapshot``, the working copies by default) as one record, encoded
        once and shared by every node's message."""
        snapshot = self.module.copies.snapshot() if snapshot is None else snapshot
        return records.share({"globals": records.snapshot_tensors(snapshot)})

    def server_entries(self, state: ClientState, extra: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The alive clusters, log C_{y,k} (FedRC) and ``extra`` entries: what every message to the
        nodes carries besides the models."""
        info: dict[str, Tensor] = {"active": state.active, **(extra or {})}
        stats = label_statistics(self.rule, state)
        if stats is not None:
            info["log_label_stats"] = stats
        return info

    def evaluate(self, grid: Grid, federation: Federation, state: ClientState) -> dict[str, float]:
        """A validation pass on the nodes (each client's validation rows under its own ω or
        personal model): ``val/local_acc`` (``val/local_mse``) over every answering node's rows.
        Each node gets the entries the server holds for its clients (ω after a merge or a
        reassignment), as a round's message does for its sampled clients."""
        models = self.models_record()
        nodes = sorted(set(federation.owner.values()) - federation.lost)
        messages = []
        for node in nodes:
            clients = federation.clients_of(node)
            sections = {
                "server": self.server_entries(state, sent_entries(state, clients, self.pushed)),
                "config": {"clients": torch.tensor(clients, dtype=torch.long)},
            }
            messages.append(Message(records.pack(sections, models), node, "query.evaluate"))
        sums = torch.zeros(2, dtype=torch.float64)
        for node, reply in exchange(grid, messages, self.round_timeout):
            if reply.has_error():
                log.warning("node %d could not evaluate its clients: %s", node, node_error(reply))
                continue
            sums += records.unpack(reply.content)["evaluation"]["sums"]
        name = f"val/local_{Task.of(federation.task).metric}"
        return {name: float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")}

    def save(self, path: str) -> None:
        """The global models, the server's client store, the round metrics and the dropped and
        rejected clients, with a content hash, written atomically (``engine/verified_files.py``)."""
        save_verified(
            {
                "state_dict": self.module.state_dict(),
                "client_state": self.module.client_state.state_dict(),
                "metrics": self.metrics,
                "dropped": self.dropped,
                "rejected": self.rejected,
            },
            path,
        )

    def round_content(
        self,
        round_index: int,
        clients: list[int],
        round_state: RoundState,
        state: ClientState,
        models: records.Record,
    ) -> RecordDict:
        config = {
            "round": torch.tensor(round_index),
            "clients": torch.tensor(clients, dtype=torch.long),
            "num-clusters": torch.tensor(int(self.strategy.num_clusters)),
        }
        info = round_hyperparameters(self.solver)
        if round_state.membership is not None:
            info["membership"] = round_state.membership
        info.update(sent_entries(state, clients, self.pushed))
        return records.pack({"server": self.server_entries(state, info), "config": config}, models)

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
                round_state.round_index + 1, node, federation.partition[node], clients,
            )  # fmt: skip
        models = self.models_record((round_state.global_clusters, round_state.global_shared))
        messages = [
            Message(self.round_content(round_state.round_index, cs, round_state, state, models), n, "train",
                    group_id=str(round_state.round_index))
            for n, cs in by_node.items() if n not in federation.lost
        ]  # fmt: skip
        answered = set()
        for node, reply in exchange(grid, messages, self.round_timeout):
            answered.add(node)
            if reply.has_error():
                self.drop(federation, node, by_node[node], round_state.round_index, node_error(reply))
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
                self.drop(federation, node, by_node[node], round_state.round_index, reason)

    def drop(
        self, federation: Federation, node: int, clients: list[int], round_index: int, reason: str
    ) -> None:
        federation.lost.add(node)
        self.dropped.setdefault(round_index, []).extend(clients)
        log.warning(
            "round %d: node %d (partition %d) failed (%s); its clients %s are dropped from this round's "
            "aggregation",
            round_index + 1, node, federation.partition[node], reason, clients,
        )  # fmt: skip

    def collect(self, grid: Grid, federation: Federation, state: ClientState, offsets: Tensor) -> None:
        """Every node's client store into the server's (``collect_client_state``: simulation)."""
        nodes = sorted(set(federation.owner.values()) - federation.lost)
        content = {"server": {"active": state.active}}
        messages = [Message(records.pack(content), n, "query.export") for n in nodes]
        for node, reply in exchange(grid, messages, self.round_timeout):
            if reply.has_error():
                log.warning("node %d could not export its client store: %s", node, node_error(reply))
                continue
            sections = records.unpack(reply.content)
            stored, clients = sections["store"], sections["node"]["clients"]
            merge_store(self.rule, state, stored, clients, offsets, self.pushed)
