"""ClusteredModule: K cluster copies of the user's LightningModule, trained as federated clients.

A thin set of Lightning hooks over the engine (``lightning_fedcluster.engine``): one Lightning
epoch is one communication round, and its one training batch runs it
(``RoundDriver.run_round``): the executor trains this process's share of the round's clients,
one all-reduce sums every process's updates, the server step and the rule's actions apply them,
so callbacks, validation and checkpoints always see aggregated weights. The round counts one step
of Lightning's optimizer: ``global_step`` is the number of rounds trained.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import Algorithm, ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.arguments import check_positive_int, check_seed
from lightning_fedcluster.datamodules.loaders import RoundBatch
from lightning_fedcluster.engine import client_vectors
from lightning_fedcluster.engine.checkpoint import CLIENT_STATE_KEY, CheckpointHooks
from lightning_fedcluster.engine.client import client_context
from lightning_fedcluster.engine.copies import (
    ClusterCopies,
    attached_trainer,
    independent_copies,
    local_solver,
    tie_shared_layers,
)
from lightning_fedcluster.engine.evaluation import Evaluation, EvaluationHooks
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
from lightning_fedcluster.engine.host import FederatedRun
from lightning_fedcluster.engine.losses import evaluate_models, pass_rows, per_sample_loss
from lightning_fedcluster.engine.lr_schedulers import RoundSchedulers
from lightning_fedcluster.engine.optimizer_state import StateLayout, persistent_layout, report_store_size
from lightning_fedcluster.engine.outputs import LogitsFrom, check_logits_from, forward_logits
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.runtime import ClientRuntime, LocalSetup, LocalSolver
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizerHooks
from lightning_fedcluster.engine.setup_checks import (
    check_output_shape,
    check_rule_on_model,
    check_training_setup,
    input_shape_error,
    warn_before_fit,
)
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.export import ClusterExport
from lightning_fedcluster.metrics.undefined import warn_nan_metrics
from lightning_fedcluster.prediction import PredictionHooks

CHECKPOINT_KEY = CLIENT_STATE_KEY
# Cumulative wall time per engine phase, in ``ClusteredModule.phase_seconds``.
PHASES = ("e_step", "local_training", "aggregation", "evaluation")


class ClusteredModule(
    PredictionHooks, ClusterExport, EvaluationHooks, CheckpointHooks, ServerOptimizerHooks, pl.LightningModule
):
    """K copies of ``module`` (whose ``forward`` returns logits, or predictions for regression)
    trained federatedly.

    The per-sample loss is ``module.per_sample_loss(batch)`` if defined, else ``module.criterion``
    (its reduction is switched to ``"none"``), else cross-entropy (classification) or the squared
    error averaged over output dimensions (regression). The optimizer comes from
    ``module.configure_optimizers()`` and is the local solver of every client (its schedulers step per round).

    Args:
        module: the user's LightningModule (reused unchanged; copied K times).
        num_clusters: K.
        seed: seeds the independent initialisation of the copies.
        eval_batch_size: largest batch of the no-grad passes (lowered to hold <= 64 MB of activations).
        shared_layers: dotted names of submodules shared by all K copies (one feature extractor,
            K clustered heads; FedRC Table 11). Shared layers are averaged over all clients.
        logits_from: where the logits are in a dict/tuple forward: a key, an index or a callable.
    """

    def __init__(
        self,
        module: nn.Module,
        num_clusters: int = 1,
        *,
        seed: int = 0,
        eval_batch_size: int = 4096,
        shared_layers: Sequence[str] = (),
        logits_from: LogitsFrom = None,
    ) -> None:
        super().__init__()
        check_positive_int("num_clusters", num_clusters)
        check_seed(seed)
        if not isinstance(module, pl.LightningModule):
            raise TypeError(
                f"module must be a LightningModule (with forward and configure_optimizers), got "
                f"{type(module).__name__}"
            )
        check_positive_int("eval_batch_size", eval_batch_size)
        if isinstance(shared_layers, str):
            shared_layers = (shared_layers,)
        self.automatic_optimization = False
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        self.pass_rows = eval_batch_size  # set in setup from the model's activation size
        self.stacked_pass_rows = eval_batch_size  # the same for K models at once (vectorised)
        self.shared_layers = tuple(shared_layers)
        self.logits_from, self.schedulers = check_logits_from(logits_from), RoundSchedulers()
        copies = independent_copies(module, num_clusters, seed)
        shared = tie_shared_layers(copies, self.shared_layers) if self.shared_layers else []
        self.models = nn.ModuleList(copies)
        self.copies = ClusterCopies(self.models, shared)
        self.client_state: ClientState | None = None
        self.round_metrics: dict[str, float] = {}
        self.rounds_trained = 0  # rounds aggregated into the weights: the logging step (checkpointed)
        self.eval_metrics: dict[str, float] = {}
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.task = Task.CLASSIFICATION
        self.executor = "loop"  # resolved from the strategy's ``executor`` when fitting starts
        self._pending_state: dict[str, Tensor] | None = None
        self._pending_metadata: dict[str, Any] | None = None
        self._resident: dict[str, Tensor] | None = None
        self._evaluation: Evaluation | None = None
        self.plan: TrainingPlan | None = None  # the strategy's, from setup on
        # The federated strategy running this module, handed in when the trainer connects it.
        self.federated: FederatedRun | None = None
        self.driver: RoundDriver | None = None  # the server side of the rounds, from on_fit_start on
        self.round_executor: Executor | None = None  # the clients' side, from on_fit_start on
        self.chunk_size: int | None = None  # clients per vectorised chunk (the vectorised executor)
        self.optimizer_layout: StateLayout | None = None  # optimizer_state="persist" only

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to ``phase_seconds[phase]`` (for benchmarks' breakdowns)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.phase_seconds[phase] += time.perf_counter() - start

    @property
    def num_clusters(self) -> int:
        return len(self.models)

    @property
    def rule(self) -> Algorithm:
        if self.plan is not None:
            return self.plan.rule
        assert self.federated is not None, "the rule is known once a federated strategy connects the module"
        return self.federated.algorithm

    @property
    def batch_size(self) -> int:
        return self.trainer.datamodule.batch_size

    @property
    def finetune_epochs(self) -> int:
        return 0 if self.plan is None else self.plan.finetune_epochs

    def reduce_sum(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over every process of the fit (itself with one process)."""
        assert self.federated is not None
        return self.federated.reduce(tensor, reduce_op="sum")

    def cluster_tensors(self, k: int) -> list[Tensor]:
        """The federated tensors of cluster k (parameters and float buffers), shared layers excluded."""
        return self.copies.cluster_tensors(k)

    def shared_tensors(self) -> list[Tensor]:
        """The federated tensors of the shared layers (empty without ``shared_layers``)."""
        return self.copies.shared_tensors()

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        from lightning_fedcluster.datamodules.federated import FederatedDataModule

        strategy, datamodule = self.federated, self.trainer.datamodule
        check_training_setup(strategy, datamodule, self.num_clusters, FederatedDataModule)
        assert strategy is not None
        self.plan = strategy.plan
        self.task = Task.of(getattr(datamodule, "task", Task.CLASSIFICATION))
        if not self.task.is_classification and self.rule.capabilities.label_stats:
            raise ValueError(
                f"{self.plan.name} uses label statistics C_(y,k), which need class labels, but the "
                "datamodule is a regression task: use FedEMStrategy (FedRC without C) for regression"
            )
        strategy.check_datamodule(datamodule)
        check_rule_on_model(self.rule, self.models[0])
        check_output_shape(self.models[0], datamodule, self.task, self.logits_from)
        sample = datamodule.train_split(0)[0][:2].to(next(self.models[0].parameters()).device)
        self.pass_rows = pass_rows(self.models[0], sample, self.eval_batch_size)
        self.stacked_pass_rows = pass_rows(self.models[0], sample, self.eval_batch_size, self.num_clusters)
        if stage == "fit":
            warn_before_fit(self.models[0], self.num_clusters, datamodule, self.task)
            strategy.round_schedule(datamodule)  # validates clients_per_round before training
            x, y = datamodule.train_split(0)
            self.executor = choose_executor(self.plan.executor, self, x, y)
            self.chunk_size = None
            if self.executor == "vectorized":
                self.chunk_size = chunk_size_for(self, self.plan.clients_per_chunk)
            datamodule.serve_rounds(self.current_round)
            self.optimizer_layout = None
            if self.plan.persists_optimizer_state:
                self.optimizer_layout = persistent_layout(self.models, self.trainer)
                report_store_size(
                    self.optimizer_layout, datamodule.num_clients, self.plan.optimizer_store_dtype
                )
        shape = (datamodule.num_clients, self.num_state_classes, self.num_clusters)
        state = self.client_state
        if state is None or (state.num_clients, state.label_sums.shape[1], state.num_clusters) != shape:
            samples = int(datamodule.train_sizes.sum())
            self.client_state = initial_client_state(self.plan, shape[0], shape[1], samples)
        if self._pending_state is not None:
            self._load_client_state(self._pending_state, self._pending_metadata)
            self._pending_state = self._pending_metadata = None
        self._resident = None

    @property
    def num_state_classes(self) -> int:
        """Rows of the label statistics: the class count, 0 for regression."""
        return self.task.label_classes(self.trainer.datamodule.num_classes)

    def configure_optimizers(self) -> Any:
        """One optimizer over all K copies, built from the user's own configure_optimizers (shared
        layers appear once), with its schedulers (stepped per round). The clients' local steps use
        it directly; Lightning's wrapper of it takes one step per round (``global_step``)."""
        return self.schedulers.configure(*local_solver(self.models, self.trainer), self.task)

    # ------------------------------------------------------------------ data and clients
    @property
    def data(self) -> dict[str, Tensor]:
        """The datamodule's tensors, resident on this module's device (moved once)."""
        if self._resident is None or self._resident["train_x"].device != self.device:
            dm = self.trainer.datamodule
            names = ("train_x", "train_y", "test_x", "test_y", "global_x", "global_y")
            self._resident = {n: getattr(dm, n).to(self.device) for n in names}
            offsets = ("train_offsets", "test_offsets", "global_offsets")
            self._resident.update({n: getattr(dm, n) for n in offsets})
        return self._resident

    def split(self, name: str, index: int) -> tuple[Tensor, Tensor]:
        """Rows of client ``index`` in split ``name`` ("train", "test" or "global")."""
        offsets = self.data[f"{name}_offsets"]
        start, stop = int(offsets[index]), int(offsets[index + 1])
        return self.data[f"{name}_x"][start:stop], self.data[f"{name}_y"][start:stop]

    def client_context(self, client: int, round_index: int, num_samples: int) -> ClientContext:
        """What the rule may know of ``client`` outside a round (FedRC-FT's fine-tuning)."""
        assert self.client_state is not None
        offsets = self.trainer.datamodule.train_offsets
        return client_context(
            self.rule,
            self.client_state,
            client,
            round_index,
            num_samples=num_samples,
            num_classes=self.num_state_classes,
            sample_rows=(int(offsets[client]), int(offsets[client + 1])),
            seed=self.seed,
            device=self.device,
        )

    def per_sample_loss(self, k: int, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
        """Loss of every sample under cluster model k, shape [N]."""
        return per_sample_loss(self.models[k], x, y, self.task, out, self.logits_from)

    @torch.no_grad()
    def evaluate_clusters(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
        """Per-sample losses [N, K] (None without labels) and outputs [K, N, ...] of every cluster
        model, in the precision plugin's forward context (autocast with "bf16-mixed"): some passes
        run in hooks (the estimation pass at fit start), where Lightning enters no step context."""
        precision = contextlib.nullcontext()
        trainer = attached_trainer(self)
        if trainer is not None:
            precision = trainer.precision_plugin.forward_context()
        try:
            with precision:
                return evaluate_models(self.models, x, y, self.task, self.pass_rows, self.logits_from)
        except RuntimeError as error:
            explained = input_shape_error(type(self.models[0]).__name__, x, error)
            if explained is error:
                raise
            raise explained from error

    def forward(self, x: Tensor) -> Tensor:
        """Outputs of every cluster model, shape [K, N, ...]."""
        return torch.stack([forward_logits(model, x, self.logits_from) for model in self.models])

    # ------------------------------------------------------------------ personal models
    def personal_copies(self) -> range:
        """The working copies a personal model occupies: copy 0 (FedSoft) or all K (D-FedEM)."""
        return client_vectors.personal_copies(self.rule, self.num_clusters)

    # ------------------------------------------------------------------ rounds
    def current_round(self) -> int:
        """The round the running training epoch trains (what the datamodule's loader yields)."""
        return self.trainer.current_epoch

    def on_fit_start(self) -> None:
        """The server side of the rounds (``engine/federation.py``) and the clients' side (this
        process's executor), on the fit's device, and the first round's preparation."""
        assert self.client_state is not None and self.plan is not None
        trainer, strategy, dm = self.trainer, self.federated, self.trainer.datamodule
        assert strategy is not None
        last = trainer.max_epochs
        schedule = strategy.round_schedule(dm)
        self.driver = RoundDriver(
            self.plan,
            ServerState(self.copies, self.client_state, self.server_optimizer, self.schedulers),
            schedule,
            ClientDirectory(dm.train_sizes, self.num_state_classes, self.task),
            device=self.device,
            optimizer_size=None if self.optimizer_layout is None else self.optimizer_layout.size,
            optimizer_in_store=strategy.world_size == 1,
            num_rounds=None if last is None or last < 0 else last,
            say=rank_zero_info,
            timed=self.timed,
        )
        processes = Processes(
            strategy.global_rank, strategy.world_size, self.reduce_sum if strategy.world_size > 1 else None
        )
        clients = LocalClients(
            self.data["train_x"], self.data["train_y"], dm.train_offsets, torch.arange(dm.num_clients),
            schedule.steps_per_client,
        )  # fmt: skip
        runtime = self.client_runtime()
        if self.executor == "vectorized":
            assert self.chunk_size is not None
            self.round_executor = VectorizedExecutor(
                runtime, clients, self.chunk_size, self.stacked_pass_rows, processes, self.timed
            )
        else:
            self.round_executor = LoopExecutor(runtime, clients, processes, self.timed)
        self.driver.prepare_round(trainer.current_epoch, self.round_executor)

    def client_runtime(self) -> ClientRuntime:
        """The fit's local setup and solver: the working copies on this device, the plan's local
        step plan, the forward in the precision plugin's context, and the torch optimizer that
        Lightning wraps (the clients' steps are not Lightning's: a round counts one step)."""
        assert self.plan is not None
        setup = LocalSetup(
            self.copies, self.plan.rule, self.task, self.seed, self.pass_rows, self.batch_size,
            self.plan.local_epochs, self.plan.drop_last, self.device, self.logits_from,
            self.num_state_classes, self.trainer.precision_plugin.forward_context,
        )  # fmt: skip
        return ClientRuntime(setup, LocalSolver.plain(self.optimizers().optimizer, self.optimizer_layout))

    def training_step(self, batch: RoundBatch, batch_idx: int) -> None:
        """One round (one epoch, one batch): this process's share of its clients, the all-reduce,
        the server step and the rule's actions (``RoundDriver.run_round``), before any callback's
        ``on_train_batch_end``, so step-based checkpoints see aggregated weights. Then one step of
        Lightning's optimizer, whose gradients are cleared first (no update): ``global_step``
        counts rounds."""
        assert self.driver is not None and self.round_executor is not None
        _, metrics = self.driver.run_round(batch.round_index, self.round_executor)
        self.rounds_trained = batch.round_index + 1
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        self._log_round_metrics(metrics)

    def _log_round_metrics(self, metrics: dict[str, float]) -> None:
        self.round_metrics = metrics
        warn_nan_metrics(metrics)
        for name, value in metrics.items():
            prog_bar = name in ("train/loss", "train/acc", "train/mse")
            options = dict(on_step=False, on_epoch=True, logger=False, batch_size=1, sync_dist=True)
            self.log(name, value, prog_bar=prog_bar, **options)

    def configure_callbacks(self) -> list[pl.Callback]:
        """A ClusterMonitor, unless the trainer has one (the user's, or ours from an earlier fit)."""
        from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor

        present = any(isinstance(c, ClusterMonitor) for c in self.trainer.callbacks)
        return [] if present else [ClusterMonitor()]
