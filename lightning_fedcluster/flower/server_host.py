"""The Flower server (the ServerApp's side): a host of the library's round, as the Lightning
module is. It waits for the nodes and learns which clients each holds, keeps the K global models
and the server's client store (ω, label sums, participation, alive clusters), and hands the rounds
to ``RoundDriver.run`` (``engine/federation.py``) with the Flower grid as the executor (``grid.py``:
the nodes train the round's clients). After each round it logs the metrics, runs the nodes'
validation pass every ``eval_every`` rounds and checkpoints its state for ``resume``
(``server_state.py``). Log lines name rounds 1-based, as the progress lines do ("round 3/10").
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid
from torch import Tensor

from lightning_fedcluster.algorithms.actions import ServerAction
from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.engine.federation import (
    EVENTS_TAG,
    ClientDirectory,
    RoundDriver,
    ServerState,
    initial_client_state,
)
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizer
from lightning_fedcluster.engine.verified_files import save_verified
from lightning_fedcluster.flower.grid import GridExecutor, GridRecords
from lightning_fedcluster.flower.messaging import exchange, undescribed_error, wait_for_nodes
from lightning_fedcluster.flower.node_registry import Federation, describe_messages, federation_of
from lightning_fedcluster.flower.reporting import console_logging, progress_line, writer_for
from lightning_fedcluster.flower.server_checkpoint import check_checkpoint_owner, resume_from, save_checkpoint
from lightning_fedcluster.flower.support import check_supported, server_schedulers
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
        self.found = GridRecords()  # dropped and rejected clients, entries the server's actions own
        self.round_seconds: list[float] = []  # wall time of each round (benchmarks)
        self.solver: Any = None  # the server's copy of the local solver, which the schedulers step
        config = self.plan.server_optimizer
        self.server_optimizer = None if config.kind == "none" else ServerOptimizer(config)

    @property
    def dropped(self) -> dict[int, list[int]]:
        """Round -> clients left out of its aggregation (their node failed or was lost)."""
        return self.found.dropped

    @property
    def rejected(self) -> dict[int, list[int]]:
        """Round -> clients whose replies failed the server's checks."""
        return self.found.rejected

    @property
    def pushed(self) -> set[str]:
        """Client-store entries the server's actions own or rewrote: sent to the nodes."""
        return self.found.pushed

    # -- setup ---------------------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        return wait_for_nodes(grid, self.min_nodes, self.node_wait)

    def describe(self, grid: Grid, nodes: list[int]) -> Federation:
        """Ask every node which clients it holds; every client of the datamodule must be held once
        (a node claiming a partition another node holds is refused, and the run goes on)."""
        messages = describe_messages(nodes, self.strategy.num_clusters)
        # A node answers once its ClientApp has started (a process, imports, its data): said while
        # it lasts, and a node still silent after node_wait ends the run naming the wait and the load.
        replies = exchange(grid, messages, self.node_wait, waiting_for="described their clients")
        missing = len(set(nodes) - {node for node, _ in replies})
        if missing:
            raise undescribed_error(missing, len(nodes), self.node_wait)
        return federation_of(replies, nodes)

    # -- rounds --------------------------------------------------------------------------------
    def run(self, grid: Grid) -> Any:
        """Every round on ``grid``; returns the module with the trained global models and the
        server's client store (plus the nodes' stores with ``collect_client_state``)."""
        console_logging()
        if self.save_path and os.path.exists(self.save_path):
            log.warning(
                "save-path %s exists (an earlier run's); this run overwrites it after its last round: "
                "give each run its own save-path to keep both",
                self.save_path,
            )
        try:
            if self.checkpoint_path and Path(self.checkpoint_path).exists():
                check_checkpoint_owner(self.checkpoint_path, self.save_path)  # before any round
            return self.rounds(grid)
        except Exception as error:  # the last line of the stream; Flower puts it in the run's status
            log.error("run failed: %s: %s", type(error).__name__, error)
            raise

    def rounds(self, grid: Grid) -> Any:
        """The engine's rounds (``RoundDriver.run``) with ``grid`` as the executor."""
        module, plan = self.module, self.plan
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
            self.strategy.round_schedule(summary, client_state=lambda: state),
            ClientDirectory(federation.sizes, federation.num_classes, federation.task),
            personal_vectors=False,  # personal models stay on the nodes
            num_rounds=self.num_rounds,
            say=log.info,
            warn=log.warning,
            check_action=lambda action: self.check_action(action, state),
        )
        grid_executor = GridExecutor(
            grid, federation, self.rule, module.copies, state, self.solver, self.round_timeout, self.found
        )
        writer = writer_for(self.log_dir)
        start = self.start(driver, federation, grid_executor)
        self._mark = time.perf_counter()

        def after_round(round_state: RoundState, metrics: dict[str, float]) -> None:
            self.after_round(driver, grid_executor, round_state, metrics, writer)

        driver.run(grid_executor, range(start, self.num_rounds), after_round)
        if writer is not None:
            writer.close()
        if self.collect_client_state:
            grid_executor.collect()
        if self.save_path:
            self.save(self.save_path)
        return module

    def after_round(
        self,
        driver: RoundDriver,
        grid_executor: GridExecutor,
        round_state: RoundState,
        metrics: dict[str, float],
        writer: Any,
    ) -> None:
        """A round's record: its rejected clients, the nodes' validation every ``eval_every``
        rounds (and after the last), the metrics (log, TensorBoard, progress line) and the
        checkpoint every ``checkpoint_every`` rounds (and after the last)."""
        round_index = round_state.round_index
        rejected = round_state.clients[(round_state.report["rejected"] > 0).cpu()].tolist()
        if rejected:
            self.found.rejected[round_index + 1] = rejected
        last = round_index + 1 == self.num_rounds
        if self.eval_every and ((round_index + 1) % self.eval_every == 0 or last):
            metrics.update(grid_executor.validate())
        metric = grid_executor.federation.task.metric
        warn_nan_metrics(metrics, {f"val/local_{metric}": NO_NODE_ROWS})
        self.metrics.append(metrics)
        self.round_seconds.append(time.perf_counter() - self._mark)
        self.module.round_metrics, self.module.rounds_trained = metrics, round_index + 1
        self.module.round_events = list(driver.notes)
        if writer is not None:
            for name, value in metrics.items():
                writer.add_scalar(name, value, round_index + 1)
            if driver.notes:
                writer.add_text(EVENTS_TAG, "\n\n".join(driver.notes), round_index + 1)
            writer.flush()
        log.info(progress_line(round_index, self.num_rounds, metrics, self.round_seconds[-1]))
        if self.checkpoint_path and ((round_index + 1) % self.checkpoint_every == 0 or last):
            save_checkpoint(self, driver, round_index, self.checkpoint_path)
        self._mark = time.perf_counter()

    def start(self, driver: RoundDriver, federation: Federation, grid_executor: GridExecutor) -> int:
        """The first round to run: after the checkpoint's (``resume`` with a checkpoint there: every
        node's store is restored from the server's before it), else 0 (prepared here)."""
        if self.resume and self.checkpoint_path and Path(self.checkpoint_path).exists():
            federation.stale |= set(federation.live_nodes())
            self.module.rounds_trained = resume_from(self, driver, self.checkpoint_path)
            return self.module.rounds_trained
        if self.resume:
            log.info("resume: no checkpoint at %s yet, so the run starts from round 1", self.checkpoint_path)
        driver.prepare_round(0, grid_executor)
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
            self.found.pushed.add(name)

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
