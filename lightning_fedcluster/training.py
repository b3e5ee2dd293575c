"""``FederatedTraining``: the fit's side of a ClusteredModule, one object the module holds.

It owns what a fit adds to the K cluster models: the strategy's plan, the client store, the
server optimizer, the local solver's LR schedulers, the executor chosen for this module, the round
driver (``engine/federation.py``, the server's side of every round) and the clients' executor
(this process's share of a round's clients). Its ``state_dict`` is what a checkpoint holds
besides the weights (``engine/checkpoint.py``: the same keys as before it was a component).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.checkpoint import (
    CLIENT_STATE_KEY,
    METADATA_KEY,
    checkpoint_entries,
    load_server_optimizer,
    restore_client_state,
)
from lightning_fedcluster.engine.client import client_context
from lightning_fedcluster.engine.copies import local_solver
from lightning_fedcluster.engine.estep_reuse import check_estep_reuse
from lightning_fedcluster.engine.executors.local import LocalClients, Processes
from lightning_fedcluster.engine.executors.loop import LoopExecutor
from lightning_fedcluster.engine.executors.select import choose_executor, chunk_size_for
from lightning_fedcluster.engine.executors.vectorized import VectorizedExecutor
from lightning_fedcluster.engine.federation import (
    ClientDirectory,
    Executor,
    RoundDriver,
    ServerState,
    initial_client_state,
)
from lightning_fedcluster.engine.host import FederatedRun, TrainingHost
from lightning_fedcluster.engine.losses import pass_rows
from lightning_fedcluster.engine.lr_schedulers import RoundSchedulers
from lightning_fedcluster.engine.optimizer_state import StateLayout, persistent_layout, report_store_size
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.runtime import ClientRuntime, LocalSetup, LocalSolver
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizer
from lightning_fedcluster.engine.setup_checks import (
    check_output_shape,
    check_rule_on_model,
    check_training_setup,
    warn_before_fit,
    warn_rounds_past_the_run,
)
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.engine.threads import (
    apply_threads,
    choose_threads,
    step_flops,
    users_threads_variable,
)
from lightning_fedcluster.metrics.undefined import warn_nan_metrics


def state_classes(task: Task, datamodule: Any) -> int:
    """Rows of the label statistics: the class count, 0 for regression."""
    return task.label_classes(datamodule.num_classes)


class FederatedTraining:
    """The plan, the client store, the server optimizer, the LR schedulers, the executor and the
    round driver of the ClusteredModule's fits. ``setup`` runs in the module's ``setup`` (the
    checks, the executor, the store), ``start`` when a fit starts on its device, ``run_round``
    for each training batch."""

    def __init__(self) -> None:
        self.plan: TrainingPlan | None = None  # the strategy's, from setup on
        self.client_state: ClientState | None = None
        self.schedulers = RoundSchedulers()
        self.rounds_trained = 0  # rounds aggregated into the weights: the logging step (checkpointed)
        self.executor = "loop"  # resolved from the plan's ``executor`` when fitting starts
        self.chunk_size: int | None = None  # clients per vectorised chunk (the vectorised executor)
        self.optimizer_layout: StateLayout | None = None  # optimizer_state="persist" only
        self.driver: RoundDriver | None = None  # the server side of the rounds, from start on
        self.round_executor: Executor | None = None  # the clients' side, from start on
        self._server_optimizer: ServerOptimizer | None = None
        self._pending: tuple[dict[str, Tensor], dict[str, Any] | None] | None = None  # loaded before setup
        self._resident: dict[str, Tensor] | None = None

    @property
    def server_optimizer(self) -> ServerOptimizer | None:
        """Built from the plan's configuration; None for ``server_optimizer="none"`` or before a plan."""
        config = None if self.plan is None else self.plan.server_optimizer
        if config is None or config.kind == "none":
            return None
        if self._server_optimizer is None or self._server_optimizer.config != config:
            self._server_optimizer = ServerOptimizer(config)
        return self._server_optimizer

    # ------------------------------------------------------------------ setup
    def setup(self, host: TrainingHost, strategy: FederatedRun | None, stage: str) -> None:
        """Check the run before anything trains, size the no-grad passes, choose the executor
        (fitting) and create (or keep) the client store; a checkpoint loaded earlier fills it."""
        from lightning_fedcluster.datamodules.federated import FederatedDataModule

        datamodule = host.trainer.datamodule
        check_training_setup(strategy, datamodule, host.num_clusters, FederatedDataModule)
        assert strategy is not None
        self.plan = strategy.plan
        host.task = Task.of(getattr(datamodule, "task", Task.CLASSIFICATION))
        if not host.task.is_classification and self.plan.rule.capabilities.label_stats:
            raise ValueError(
                f"{self.plan.name} uses label statistics C_(y,k), which need class labels, but the "
                "datamodule is a regression task: use FedEMStrategy (FedRC without C) for regression"
            )
        strategy.check_datamodule(datamodule)
        model = host.models[0]
        check_rule_on_model(self.plan.rule, model)
        check_output_shape(model, datamodule, host.task, host.logits_from)
        sample = datamodule.train_split(0)[0][:2].to(next(model.parameters()).device)
        host.pass_rows = pass_rows(model, sample, host.eval_batch_size)
        host.stacked_pass_rows = pass_rows(model, sample, host.eval_batch_size, host.num_clusters)
        if stage == "fit":
            self._prepare_fit(host, strategy, datamodule)
        shape = (datamodule.num_clients, state_classes(host.task, datamodule), host.num_clusters)
        state = self.client_state
        if state is None or (state.num_clients, state.label_sums.shape[1], state.num_clusters) != shape:
            samples = int(datamodule.train_sizes.sum())
            self.client_state = initial_client_state(self.plan, shape[0], shape[1], samples)
        if self._pending is not None:
            restore_client_state(self.client_state, *self._pending, self.plan)
            self._pending = None
        self._resident = None

    def _choose_threads(self, host: TrainingHost, strategy: FederatedRun, x: Tensor) -> None:
        """torch's intra-op threads for the fit (``engine/threads.py``), said on the console. With
        several processes only an explicit ``num_threads`` changes Lightning's count, so that every
        process runs with the same count (bit-identical results need it)."""
        requested = self.plan.num_threads
        if strategy.world_size > 1 and requested is None:
            return
        flops = step_flops(host.models[0], x[:1].to(host.device), host.batch_size, host.num_clusters)
        choice = choose_threads(requested, users_threads_variable(), flops)
        apply_threads(choice)
        rank_zero_info(choice.describe())

    def _prepare_fit(self, host: TrainingHost, strategy: FederatedRun, datamodule: Any) -> None:
        assert self.plan is not None
        warn_before_fit(host.models[0], host.num_clusters, datamodule, host.task)
        warn_rounds_past_the_run(self.plan.rule.config, host.trainer.max_epochs)
        strategy.round_schedule(datamodule)  # validates clients_per_round before training
        x, y = datamodule.train_split(0)
        self._choose_threads(host, strategy, x)
        self.executor = choose_executor(self.plan.executor, host, x, y)
        if self.plan.reuse_estep_forward:
            check_estep_reuse(self.plan.rule, host.models[0])
        self.chunk_size = None
        if self.executor == "vectorized":
            self.chunk_size = chunk_size_for(host, self.plan.clients_per_chunk)
        datamodule.serve_rounds(host.current_round)  # the round each training epoch runs
        self.optimizer_layout = None
        if self.plan.persists_optimizer_state:
            self.optimizer_layout = persistent_layout(host.models, host.trainer)
            report_store_size(self.optimizer_layout, datamodule.num_clients, self.plan.optimizer_store_dtype)

    def configure_optimizers(self, host: TrainingHost) -> Any:
        """One optimizer over all K copies, built from the user's own configure_optimizers (shared
        layers appear once), with its schedulers (stepped per round)."""
        return self.schedulers.configure(*local_solver(host.models, host.trainer), host.task)

    # ------------------------------------------------------------------ data
    def resident(self, host: TrainingHost) -> dict[str, Tensor]:
        """The datamodule's tensors, resident on the host's device (moved once)."""
        if self._resident is None or self._resident["train_x"].device != host.device:
            dm = host.trainer.datamodule
            names = ("train_x", "train_y", "test_x", "test_y", "global_x", "global_y")
            self._resident = {n: getattr(dm, n).to(host.device) for n in names}
            offsets = ("train_offsets", "test_offsets", "global_offsets")
            self._resident.update({n: getattr(dm, n) for n in offsets})
        return self._resident

    def split(self, host: TrainingHost, name: str, index: int) -> tuple[Tensor, Tensor]:
        """Rows of client ``index`` in split ``name`` ("train", "test" or "global")."""
        data = self.resident(host)
        offsets = data[f"{name}_offsets"]
        start, stop = int(offsets[index]), int(offsets[index + 1])
        return data[f"{name}_x"][start:stop], data[f"{name}_y"][start:stop]

    def client_context(
        self, host: TrainingHost, client: int, round_index: int, num_samples: int
    ) -> ClientContext:
        """What the rule may know of ``client`` outside a round (FedRC-FT's fine-tuning)."""
        assert self.client_state is not None
        datamodule = host.trainer.datamodule
        offsets = datamodule.train_offsets
        return client_context(
            host.rule,
            self.client_state,
            client,
            round_index,
            num_samples=num_samples,
            num_classes=state_classes(host.task, datamodule),
            sample_rows=(int(offsets[client]), int(offsets[client + 1])),
            seed=host.seed,
            device=host.device,
        )

    # ------------------------------------------------------------------ rounds
    def start(self, host: TrainingHost, strategy: FederatedRun | None) -> None:
        """The server side of the rounds (``engine/federation.py``) and the clients' side (this
        process's executor), on the fit's device, and the first round's preparation."""
        assert self.client_state is not None and self.plan is not None and strategy is not None
        trainer, dm = host.trainer, host.trainer.datamodule
        last, classes = trainer.max_epochs, state_classes(host.task, dm)
        schedule = strategy.round_schedule(dm)
        self.driver = RoundDriver(
            self.plan,
            ServerState(host.copies, self.client_state, self.server_optimizer, self.schedulers),
            schedule,
            ClientDirectory(dm.train_sizes, classes, host.task),
            device=host.device,
            optimizer_size=None if self.optimizer_layout is None else self.optimizer_layout.size,
            optimizer_in_store=strategy.world_size == 1,
            num_rounds=None if last is None or last < 0 else last,
            say=rank_zero_info,
            timed=host.timed,
        )
        processes = Processes(
            strategy.global_rank, strategy.world_size, host.reduce_sum if strategy.world_size > 1 else None
        )
        data = self.resident(host)
        clients = LocalClients(
            data["train_x"], data["train_y"], dm.train_offsets, torch.arange(dm.num_clients),
            schedule.steps_per_client,
        )  # fmt: skip
        setup = LocalSetup(
            host.copies, self.plan.rule, host.task, host.seed, host.pass_rows, host.batch_size,
            self.plan.local_epochs, self.plan.drop_last, host.device, host.logits_from, classes,
            trainer.precision_plugin.forward_context, self.plan.gradient_clip_val,
            self.plan.reuse_estep_forward,
        )  # fmt: skip
        # The clients' steps use the torch optimizer Lightning wraps (a round counts one step).
        runtime = ClientRuntime(setup, LocalSolver.plain(host.optimizers().optimizer, self.optimizer_layout))
        if self.executor == "vectorized":
            assert self.chunk_size is not None
            self.round_executor = VectorizedExecutor(
                runtime, clients, self.chunk_size, host.stacked_pass_rows, processes, host.timed
            )
        else:
            self.round_executor = LoopExecutor(runtime, clients, processes, host.timed)
        self.driver.prepare_round(trainer.current_epoch, self.round_executor)

    @property
    def round_events(self) -> list[str]:
        """The notes of the last round's server actions (a merge, a removal, a grouping), in order."""
        return [] if self.driver is None else list(self.driver.notes)

    def run_round(self, host: TrainingHost, round_index: int) -> dict[str, float]:
        """One round (``RoundDriver.run_round``), then one step of Lightning's optimizer, whose
        gradients are cleared first (no update): ``global_step`` counts rounds. Returns the
        round's training metrics."""
        assert self.driver is not None and self.round_executor is not None
        _, metrics = self.driver.run_round(round_index, self.round_executor)
        self.rounds_trained = round_index + 1
        optimizer = host.optimizers()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries besides the weights: the server optimizer's state, the client
        store and the metadata that resuming checks (``engine/checkpoint.py``)."""
        return checkpoint_entries(self.plan, self.client_state, self.server_optimizer, self.rounds_trained)

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Restore the entries of ``state_dict``; the client store waits for ``setup`` when the
        checkpoint is loaded before it exists."""
        load_server_optimizer(self.server_optimizer, checkpoint)
        self.rounds_trained = int((checkpoint.get(METADATA_KEY) or {}).get("rounds_trained", 0))
        state = checkpoint.get(CLIENT_STATE_KEY)
        if state is None:
            return
        if self.client_state is None:
            self._pending = (state, checkpoint.get(METADATA_KEY))
        else:
            assert self.plan is not None
            restore_client_state(self.client_state, state, checkpoint.get(METADATA_KEY), self.plan)


def log_round_metrics(log: Callable[..., None], metrics: dict[str, float]) -> dict[str, float]:
    """Log a round's training metrics through ``LightningModule.log`` (the ClusterMonitor gives
    the loggers the round as the step); returns them."""
    warn_nan_metrics(metrics)
    options = dict(on_step=False, on_epoch=True, logger=False, batch_size=1, sync_dist=True)
    for name, value in metrics.items():
        log(name, value, prog_bar=name in ("train/loss", "train/acc", "train/mse"), **options)
    return metrics
