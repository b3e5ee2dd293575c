"""A Flower node (the ClientApp's side): the partition of the datamodule's clients it holds, the
K working copies, and one round of its sampled clients through the same local executor as a
Lightning process's (``engine/executors/loop.py``: ``LoopExecutor``).

What stays on the node, in ``context.state``: every client's ω, label sums, algorithm state
(FedRC-Adam γ and moments), persistent optimizer state and FedSoft personal model. What it
sends: the float64 sums of its clients' weighted updates Σ w·(θ_local − θ_k) per cluster with
their weights, and the round's report as declared (``RoundState.reply``: the clients' ω and
(noised, FedRC App. E) label sums, the summed training metrics, the rule's reported entries but
the per-sample ones); the clients' trained models or updates when the rule's server needs them
(CFL, FeSEM's first round); for an estimation pass, its clients' estimates (FedSoft's importance).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, RecordDict
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.engine import client_vectors, server_step
from lightning_fedcluster.engine.client_sampling import local_steps_per_client
from lightning_fedcluster.engine.estep_reuse import check_estep_reuse
from lightning_fedcluster.engine.evaluation import client_prediction, score
from lightning_fedcluster.engine.executors.local import LocalClients, estimation_pass
from lightning_fedcluster.engine.executors.loop import LoopExecutor
from lightning_fedcluster.engine.federation import initial_client_state
from lightning_fedcluster.engine.losses import pass_rows
from lightning_fedcluster.engine.optimizer_state import persistent_layout
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.engine.runtime import ClientRuntime, LocalSetup, LocalSolver
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.flower import records
from lightning_fedcluster.flower.support import clustered_module, flower_optimizer, set_round_hyperparameters

PARTITION_ID, NUM_PARTITIONS, NUM_CLUSTERS = "partition-id", "num-partitions", "num-clusters"
STATE_KEY = "fedcluster.client_store"
log = logging.getLogger("lightning_fedcluster.flower")
SERVER_VECTORS = ("model", "update")  # per-client vectors the server's rule reads (never "personal")


class NodeConfigError(ValueError):
    """The node's ``--node-config`` does not fit the run."""


def node_clients(node_config: dict[str, Any], num_clients: int) -> Tensor:
    """The datamodule's clients this node holds: block ``partition-id`` of ``num-partitions``
    consecutive blocks of the client ids."""
    missing = [key for key in (PARTITION_ID, NUM_PARTITIONS) if key not in node_config]
    if missing:
        raise NodeConfigError(
            f"node config lacks {' and '.join(repr(m) for m in missing)}: start the SuperNode with "
            f"--node-config 'partition-id=<i> num-partitions=<n>' (which block of the datamodule's "
            f"{num_clients} clients it holds)"
        )
    partition, parts = node_config[PARTITION_ID], node_config[NUM_PARTITIONS]
    if not (isinstance(parts, int) and isinstance(partition, int) and 1 <= parts <= num_clients):
        raise NodeConfigError(
            f"node config num-partitions={parts!r} must be an integer between 1 and the datamodule's "
            f"{num_clients} clients"
        )
    if not 0 <= partition < parts:
        raise NodeConfigError(
            f"node config partition-id={partition!r} must be between 0 and num-partitions - 1 = {parts - 1}"
        )
    return torch.arange(num_clients).tensor_split(parts)[partition]


def check_num_clusters(node_config: dict[str, Any], num_clusters: int) -> None:
    """A node may pin the number of clusters it agreed to (``num-clusters`` in its node config)."""
    pinned = node_config.get(NUM_CLUSTERS)
    if pinned is not None and pinned != num_clusters:
        raise NodeConfigError(
            f"node config num-clusters={pinned!r} but the run trains K={num_clusters} cluster models: "
            "fix the SuperNode's --node-config or the strategy's num_clusters"
        )


def built(value: Any) -> Any:
    """An instance as it is; a zero-argument factory (a class, a function) called."""
    from torch import nn

    return value if isinstance(value, nn.Module) or not callable(value) else value()


@dataclass
class NodeFactory:
    """How a node builds its side of the run (picklable: Flower's simulation ships it to its
    workers): the training plan, the user's LightningModule and the datamodule (instances or
    zero-argument factories)."""

    plan: TrainingPlan | Callable[[], TrainingPlan]
    module: Any
    datamodule: Any

    def build(self, node_config: dict[str, Any]) -> NodeRuntime:
        plan = self.plan if isinstance(self.plan, TrainingPlan) else self.plan()
        return NodeRuntime(plan, built(self.module), built(self.datamodule), node_config)


class NodeRuntime:
    """A node's clients, working copies, solver and local setup (built once per run and node)."""

    def __init__(self, plan: TrainingPlan, module: Any, datamodule: Any, node_config: dict[str, Any]) -> None:
        from lightning_fedcluster.module import ClusteredModule

        self.plan, self.datamodule = plan, datamodule
        self.node_config = dict(node_config)
        self.clients = node_clients(self.node_config, datamodule.num_clients)
        check_num_clusters(self.node_config, plan.num_clusters)
        # A node trains its own copy (a ClusteredModule instance may also serve the server).
        clustered = (
            copy.deepcopy(module) if isinstance(module, ClusteredModule) else clustered_module(plan, module)
        )
        self.task = Task.of(getattr(datamodule, "task", Task.CLASSIFICATION))
        self.num_classes = self.task.label_classes(datamodule.num_classes)
        self.copies = clustered.copies
        sample = datamodule.train_split(int(self.clients[0]))[0][:2]
        rows = pass_rows(clustered.models[0], sample, clustered.eval_batch_size)
        self.setup = LocalSetup(
            self.copies, plan.rule, self.task, plan.seed, rows,
            datamodule.batch_size, plan.local_epochs, plan.drop_last, torch.device("cpu"),
            clustered.logits_from, self.num_classes, gradient_clip_val=plan.gradient_clip_val,
            reuse_estep_forward=plan.reuse_estep_forward,
        )  # fmt: skip
        if plan.reuse_estep_forward:
            check_estep_reuse(plan.rule, clustered.models[0])
        optimizer = flower_optimizer(clustered.models)
        layout = persistent_layout(clustered.models) if plan.optimizer_state == "persist" else None
        self.solver = LocalSolver.plain(optimizer, layout)
        sizes = datamodule.train_sizes
        steps = local_steps_per_client(
            sizes, datamodule.batch_size, plan.local_steps, plan.local_epochs, plan.drop_last
        )
        self.sizes = sizes[self.clients]
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), self.sizes.cumsum(0)])
        self.row = {int(c): r for r, c in enumerate(self.clients.tolist())}
        # The node's clients by their row in its store; the same local executor as a Lightning process's.
        splits = [datamodule.train_split(int(c)) for c in self.clients]
        x, y = torch.cat([s[0] for s in splits]), torch.cat([s[1] for s in splits])
        self.held = LocalClients(x, y, self.offsets, self.clients.clone(), steps[self.clients])
        self.executor = LoopExecutor(ClientRuntime(self.setup, self.solver), self.held)

    # -- the node's client store ---------------------------------------------------------------
    def initial_state(self) -> ClientState:
        return initial_client_state(self.plan, len(self.clients), self.num_classes, int(self.sizes.sum()))

    def load_state(self, context: Context, active: Tensor) -> ClientState:
        """The node's store, with the clusters the server removed since its last message removed
        (ω and γ renormalised as the server's store was) and those it started marked alive."""
        state = self.initial_state()
        if STATE_KEY in context.state:
            records.load_state(state, context.state[STATE_KEY])  # type: ignore[arg-type]
        active = active.to(torch.bool)
        if bool((state.active & ~active).any()):
            state.remove_clusters(state.active & ~active)  # and the declared mixtures (γ) with ω
        state.active = active.clone()  # and the clusters it started (CFL's splits)
        return state

    # -- messages ------------------------------------------------------------------------------
    def check_run(self, num_clusters: int) -> None:
        """The server's K must be the node's (its node config may pin it; its strategy has one)."""
        check_num_clusters(self.node_config, num_clusters)
        if num_clusters != self.plan.num_clusters:
            raise NodeConfigError(
                f"the server trains K={num_clusters} cluster models but this node's {self.plan.name} has "
                f"num_clusters={self.plan.num_clusters}: run the same strategy on the server and the nodes"
            )

    def describe(self) -> RecordDict:
        """What the server needs to schedule rounds: the node's clients and their sizes."""
        info = ConfigRecord(
            {
                "clients": [int(c) for c in self.clients],
                "sizes": [int(s) for s in self.sizes],
                "num-clients": int(self.datamodule.num_clients),
                "num-classes": int(self.num_classes),
                "task": self.task,
                "partition-id": int(self.node_config[PARTITION_ID]),
            }
        )
        return RecordDict({"node": info})

    def train(self, content: RecordDict, context: Context) -> RecordDict:
        """One round of the node's sampled clients; the node's summed updates and reports."""
        sections = records.unpack(content)
        config = sections["config"]
        round_index, clients = int(config["round"]), config["clients"].tolist()
        self.check_run(int(config["num-clusters"]))
        unknown = [c for c in clients if c not in self.row]
        if unknown:
            raise NodeConfigError(
                f"the server sent clients {unknown}, which this node's partition does not hold"
            )
        snapshot = records.tensors_snapshot(sections["globals"], self.plan.num_clusters)
        info = sections["server"]
        set_round_hyperparameters(
            self.solver.optimizer, {k: v for k, v in info.items() if k.startswith("hyper.")}
        )
        state = self.load_state(context, info["active"])
        rows = torch.tensor([self.row[c] for c in clients], dtype=torch.long)
        take_pushed(state, info, rows)
        layout = self.solver.layout
        round_state = RoundState(
            round_index, rows, self.sizes[rows], snapshot, self.plan.rule, state, self.num_classes,
            client_vectors.vector_size(self.copies, self.plan.rule, state), self.setup.device,
            optimizer_size=None if layout is None else layout.size, optimizer_in_store=True,
            limits=self.plan.reply_limits,
        )  # fmt: skip
        round_state.membership = info.get("membership")
        round_state.log_label_stats = info.get("log_label_stats")
        self.copies.models.train()
        self.executor.train(round_state)
        send_vectors = client_vectors.vector_kind(self.plan.rule, state) in SERVER_VECTORS
        server_step.record_round(self.plan.rule, state, round_state, self.offsets)
        context.state[STATE_KEY] = records.state_record(state)
        return self.reply(round_state, clients, send_vectors)

    @staticmethod
    def reply(round_state: RoundState, clients: list[int], send_vectors: bool) -> RecordDict:
        """The node's summed updates and its report (``RoundState.reply``: the clients that passed
        the reply checks here, those that did not as ``rejected`` (logged here), and every declared
        segment but the per-sample ones), plus its clients' vectors when the server's rule reads
        them."""
        for rejection in round_state.rejections:
            log.warning("%s", rejection)
        deltas = records.snapshot_tensors((round_state.delta_sum, round_state.delta_shared))
        report = round_state.reply(torch.tensor(clients, dtype=torch.long))
        reported = round_state.reported_slots()
        if send_vectors:  # CFL's updates, FeSEM's first-round models: the rule's server needs them
            report["vectors"] = round_state.vectors["vectors"][reported]
        return records.pack({"update": deltas, "report": report})

    @torch.no_grad()
    def estimate(self, content: RecordDict, context: Context) -> RecordDict:
        """An estimation pass (FedSoft's importance): ``rule.estimate`` of every client of the node
        on its training losses under the K global models."""
        sections = records.unpack(content)
        self.copies.load(records.tensors_snapshot(sections["globals"], self.plan.num_clusters))
        active = sections["server"]["active"].to(torch.bool)
        estimates = estimation_pass(self.setup, self.held, active)
        found = {"clients": self.clients.clone(), "estimates": estimates}
        return records.pack({"estimates": found})

    @torch.no_grad()
    def evaluate(self, content: RecordDict, context: Context) -> RecordDict:
        """A validation pass over the node's clients, as the Lightning engine's ``val/local_*``:
        each client's validation rows scored by its mixture of the K global models with its own
        ω (FedSoft: by its personal model). Sends the summed score and row count."""
        sections = records.unpack(content)
        snapshot = records.tensors_snapshot(sections["globals"], self.plan.num_clusters)
        self.copies.load(snapshot)
        info = sections["server"]
        state = self.load_state(context, info["active"])
        if "config" in sections:  # the server's entries of the node's clients (ω after a merge)
            rows = torch.tensor([self.row[int(c)] for c in sections["config"]["clients"]], dtype=torch.long)
            take_pushed(state, info, rows)
        sums = torch.zeros(2, dtype=torch.float64)
        for row, client in enumerate(self.clients.tolist()):
            x, y = self.datamodule.val_split(client)
            if x.shape[0] == 0:
                continue
            prediction = self.client_prediction(state, row, x, snapshot)
            sums += torch.stack([score(prediction, y, self.task), torch.tensor(float(y.shape[0]))])
        return records.pack({"evaluation": {"sums": sums}})

    def client_prediction(self, state: ClientState, row: int, x: Tensor, snapshot: Any) -> Tensor:
        """A client's prediction as the Lightning engine's validation makes it
        (``engine/evaluation.py``'s ``client_prediction``)."""
        personal = state.personal.get(row) if self.plan.rule.capabilities.personal_models else None
        personal_copies = client_vectors.personal_copies(self.plan.rule, self.plan.num_clusters)
        return client_prediction(
            self.plan.rule, self.copies, lambda rows: self.setup.evaluate(rows)[1], x, state.omega[row],
            personal, personal_copies, snapshot,
        )  # fmt: skip

    def restore(self, content: RecordDict, context: Context) -> RecordDict:
        """The server's rows of this node's clients (ω, label sums, participation, per-client
        entries) into the node's store: a node that comes back, or whose reply was not merged, goes
        on from what the server recorded for its clients. The state only nodes hold (per-sample
        entries, optimizer state, personal models) stays as it is."""
        sections = records.unpack(content)
        clients = sections["node"]["clients"]
        if not torch.equal(clients, self.clients):
            raise NodeConfigError(
                f"the server restores clients {clients.tolist()} but this node holds {self.clients.tolist()}"
            )
        state = self.load_state(context, sections["server"]["active"])
        for key, value in sections["store"].items():
            name = key.removeprefix("extra.")
            target = state.extra.get(name) if key.startswith("extra.") else getattr(state, key)
            if target is None or target.shape != value.shape:
                raise NodeConfigError(
                    f"the server restores {key} {tuple(value.shape)}, which this node does not keep"
                )
            target.copy_(value)
        context.state[STATE_KEY] = records.state_record(state)
        return records.pack({"restored": {"clients": clients.clone()}})

    def export(self, content: RecordDict, context: Context) -> RecordDict:
        """The node's client store (simulation only: ``simulate`` returns every client's state)."""
        state = self.load_state(context, records.unpack(content)["server"]["active"])
        return records.pack({"store": state.state_dict(), "node": {"clients": self.clients.clone()}})


def take_pushed(state: ClientState, info: dict[str, Tensor], rows: Tensor) -> None:
    """The client-store entries the server sends (``store.<name>``: ω and label sums after a
    server action rewrote them, the entries the server owns, the per-cluster and run-wide ones),
    by their declared scope: a per-client entry for the message's clients (``rows`` of the node's
    store), the others whole."""
    for key, value in info.items():
        if not key.startswith("store."):
            continue
        name = key.removeprefix("store.")
        if name in ("omega", "label_sums"):
            stored = getattr(state, name)
            stored[rows] = value.to(stored.dtype)
        elif state.entries[name].scope == Scope.CLIENT:
            state.extra[name][rows] = value.to(state.extra[name].dtype)
        else:
            state.extra[name] = value.to(state.extra[name].dtype).clone()
