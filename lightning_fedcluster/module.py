"""ClusteredModule: K cluster copies of the user's LightningModule, trained as federated clients.

The Lightning host of the engine: one epoch is one round, run by its one training batch
(``RoundDriver.run_round``), so callbacks, validation and checkpoints see aggregated weights and
``global_step`` counts rounds. The module holds the K copies and composes the rest, to which its
hooks and methods delegate: ``federation`` (``training.py``: plan, client store, server optimizer,
schedulers, executor, round driver, checkpoint entries), ``evaluation`` (``engine/evaluation.py``),
``predictions`` (``prediction.py``) and the export functions (``export.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lightning_fedcluster import export
from lightning_fedcluster.algorithms.base import Algorithm, ClientContext
from lightning_fedcluster.arguments import check_positive_int, check_seed
from lightning_fedcluster.datamodules.loaders import EvaluationChunk, RoundBatch
from lightning_fedcluster.engine.checkpoint import check_checkpoint
from lightning_fedcluster.engine.copies import (
    ClusterCopies,
    attached_trainer,
    independent_copies,
    tie_shared_layers,
)
from lightning_fedcluster.engine.evaluation import Evaluator
from lightning_fedcluster.engine.host import FederatedRun
from lightning_fedcluster.engine.losses import evaluate_explained, per_sample_loss
from lightning_fedcluster.engine.outputs import LogitsFrom, check_logits_from, forward_logits
from lightning_fedcluster.engine.runtime import PHASES, PhaseClock
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.prediction import ClientPredictor, Predictions
from lightning_fedcluster.training import FederatedTraining, log_round_metrics

__all__ = ["PHASES", "ClusteredModule"]


def _delegated(component: str, name: str, doc: str) -> property:
    """An attribute of the module that lives in one of its components (read and written there)."""
    return property(
        lambda self: getattr(getattr(self, component), name),
        lambda self, value: setattr(getattr(self, component), name, value),
        doc=doc,
    )


class ClusteredModule(pl.LightningModule):
    """K copies of ``module`` (whose ``forward`` returns logits, or predictions for regression)
    trained federatedly.

    The per-sample loss is ``module.per_sample_loss(batch)`` if defined, else ``module.criterion``
    (its reduction is switched to ``"none"``), else cross-entropy (classification) or the squared
    error averaged over output dimensions (regression). The optimizer comes from
    ``module.configure_optimizers()`` and is the local solver of every client (its schedulers step per round).

    Args:
        module: the user's LightningModule (reused unchanged; copied K times).
        num_clusters: K.
        seed: seeds the independent initialisation of the copies (a strategy that wraps a plain
            module passes its own). The run's seed (client sampling, minibatch order) is the
            strategy's, its one home: ``self.seed`` reads it from the plan during a fit.
        eval_batch_size: largest batch of the no-grad passes (lowered to hold <= 64 MB of activations).
        shared_layers: dotted names of submodules shared by all K copies (one feature extractor,
            K clustered heads; FedRC Table 11). Shared layers are averaged over all clients.
        logits_from: where the logits are in a dict/tuple forward: a key, an index or a callable.

    ``shared_layers`` and ``logits_from`` live here, their one home (a strategy's keywords of the
    same names only build the module it wraps around a plain LightningModule, and are refused
    with a ClusteredModule: ``strategies/module_options.py``).
    """

    client_state = _delegated("federation", "client_state", "The client store, from setup on.")
    rounds_trained = _delegated("federation", "rounds_trained", "Rounds aggregated into the weights.")
    plan = _delegated("federation", "plan", "The strategy's training plan, from setup on.")
    executor = _delegated("federation", "executor", '"loop" or "vectorized": the fit\'s executor.')
    chunk_size = _delegated("federation", "chunk_size", "Clients per vectorised chunk.")
    optimizer_layout = _delegated("federation", "optimizer_layout", 'optimizer_state="persist" only.')
    round_executor = _delegated("federation", "round_executor", "This process's executor (fit).")
    schedulers = _delegated("federation", "schedulers", "The local solver's LR schedulers.")
    driver = _delegated("federation", "driver", "The server side of the rounds (fit).")
    phase_seconds = _delegated("clock", "seconds", "Cumulative wall time per engine phase (PHASES).")
    server_optimizer = property(lambda self: self.federation.server_optimizer, doc="None: plain averaging.")

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
        self.init_seed = seed  # the copies' initialisation; ``seed`` is the run's
        self.eval_batch_size = eval_batch_size
        self.pass_rows = eval_batch_size  # set in setup from the model's activation size
        self.stacked_pass_rows = eval_batch_size  # the same for K models at once (vectorised)
        self.shared_layers = tuple(shared_layers)
        self.logits_from = check_logits_from(logits_from)
        copies = independent_copies(module, num_clusters, seed)
        shared = tie_shared_layers(copies, self.shared_layers) if self.shared_layers else []
        self.models = nn.ModuleList(copies)
        self.copies = ClusterCopies(self.models, shared)
        self.task = Task.CLASSIFICATION
        self.round_metrics: dict[str, float] = {}
        self.round_events: list[str] = []  # the last round's server-action notes (ClusterMonitor logs them)
        self.eval_metrics: dict[str, float] = {}
        self.clock = PhaseClock()
        # The federated strategy running this module, handed in when the trainer connects it.
        self.federated: FederatedRun | None = None
        self.federation = FederatedTraining()
        self.evaluation = Evaluator()
        self.predictions = Predictions(self)

    @property
    def seed(self) -> int:
        """The run's seed: the strategy's (from its plan) once a fit has set the module up, else the
        seed the copies were initialised with."""
        federation = self.__dict__.get("federation")
        plan = None if federation is None else federation.plan
        return self.init_seed if plan is None else plan.seed

    def timed(self, phase: str) -> contextlib.AbstractContextManager[None]:
        """Add the wall time of the block to ``phase_seconds[phase]`` (for benchmarks' breakdowns)."""
        return self.clock.timed(phase, self.device)

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

    def split(self, name: str, index: int) -> tuple[Tensor, Tensor]:
        """Rows of client ``index`` in split ``name`` ("train", "test" or "global"), on this device."""
        return self.federation.split(self, name, index)

    def client_context(self, client: int, round_index: int, num_samples: int) -> ClientContext:
        """What the rule may know of ``client`` outside a round (FedRC-FT's fine-tuning)."""
        return self.federation.client_context(self, client, round_index, num_samples)

    def per_sample_loss(self, k: int, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
        """Loss of every sample under cluster model k, shape [N]."""
        return per_sample_loss(self.models[k], x, y, self.task, out, self.logits_from)

    @torch.no_grad()
    def evaluate_clusters(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
        """Per-sample losses [N, K] (None without labels) and outputs [K, N, ...] of every cluster
        model, in the precision plugin's forward context (autocast with "bf16-mixed")."""
        trainer = attached_trainer(self)
        context = contextlib.nullcontext() if trainer is None else trainer.precision_plugin.forward_context()
        return evaluate_explained(self.models, x, y, self.task, self.pass_rows, self.logits_from, context)

    def forward(self, x: Tensor) -> Tensor:
        """Outputs of every cluster model, shape [K, N, ...]."""
        return torch.stack([forward_logits(model, x, self.logits_from) for model in self.models])

    def current_round(self) -> int:
        """The round the running training epoch trains (what the datamodule's loader yields)."""
        return self.trainer.current_epoch

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        self.federation.setup(self, self.federated, stage)

    def configure_optimizers(self) -> Any:
        """One optimizer over all K copies from the user's configure_optimizers, with its schedulers."""
        return self.federation.configure_optimizers(self)

    def configure_callbacks(self) -> list[pl.Callback]:
        """A ClusterMonitor, unless the trainer has one (the user's, or ours from an earlier fit)."""
        from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor

        present = any(isinstance(c, ClusterMonitor) for c in self.trainer.callbacks)
        return [] if present else [ClusterMonitor()]

    def on_fit_start(self) -> None:
        self.federation.start(self, self.federated)

    def training_step(self, batch: RoundBatch, batch_idx: int) -> None:
        """One round, before any callback's ``on_train_batch_end``: checkpoints see its weights."""
        self.round_metrics = log_round_metrics(self.log, self.federation.run_round(self, batch.round_index))
        self.round_events = self.federation.round_events

    def on_validation_epoch_start(self) -> None:
        self.evaluation.start(self, "val")

    def on_test_epoch_start(self) -> None:
        self.evaluation.start(self, "test")

    def validation_step(self, batch: EvaluationChunk, batch_idx: int) -> None:
        self.evaluation.step(self, batch)

    test_step = validation_step  # one chunk of clients (or one unseen client) scored either way

    def on_validation_epoch_end(self) -> None:
        self.eval_metrics = self.evaluation.finish(self, "val", self.log)

    def on_test_epoch_end(self) -> None:
        self.eval_metrics = self.evaluation.finish(self, "test", self.log)

    def on_predict_epoch_start(self) -> None:
        self.predictions.start()

    def on_predict_epoch_end(self) -> None:
        self.predictions.end()

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict:
        """Personalised predictions of one batch (``prediction.py`` lists the dict's keys)."""
        return self.predictions.step(batch)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint.update(self.federation.state_dict())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_checkpoint(checkpoint, self.num_clusters, self.models, attached_trainer(self))
        self.federation.load_state_dict(checkpoint)

    # ------------------------------------------------------------------ predictions and export
    def adapt(self, x: Tensor, y: Tensor) -> Tensor:
        """Mixture weights ω [K] of a client that took no part in training, from its labelled
        data (the algorithm's rule: iterated E-step, lowest loss, ...); the models are not changed."""
        return self.predictions.adapt(x, y)

    def new_client(self, x: Tensor, y: Tensor) -> ClientPredictor:
        """A predictor for a new client from its labelled data, without training the cluster models."""
        return ClientPredictor(omega=self.adapt(x, y), module=self)

    def mixture_prior(self) -> Tensor:
        """ω [K] of a client without labels: the participating clients' ω weighted by their
        training samples (``prediction.mixture_prior``)."""
        return self.predictions.mixture_prior()

    def predict_proba(
        self, x: Tensor, omega: Tensor | None = None, *, client: int | Tensor | None = None
    ) -> Tensor:
        """p(y|x) [N, C] (regression: the mixture prediction [N, D]) of the cluster models.

        Give at most one of: ``omega`` (mixture weights [K], mixed by the rule's prediction
        weights), ``client`` (a participating client's index, or one per row [N]; -1 marks a row
        of a client without labels), or neither (every row from a client without labels: the
        mixture prior). A participating client predicts as the evaluation scores it: with its own
        ω, its personal model (FedSoft, D-FedEM), or models fine-tuned on its data (FedRC-FT)."""
        return self.predictions.predict_proba(x, omega, client=client)

    def predict(
        self, x: Tensor, omega: Tensor | None = None, *, client: int | Tensor | None = None
    ) -> Tensor:
        """Predicted labels [N] (regression: predictions [N, D]); arguments as ``predict_proba``."""
        return self.task.predict(self.predict_proba(x, omega, client=client))

    def current_label_stats(self) -> Tensor | None:
        """log C_{y,k} of the trained client store on this device (None: the rule keeps none)."""
        return self.predictions.current_label_stats()

    def active_clusters(self) -> list[int]:
        """The clusters alive: all K, except FedRC's removed clusters and CFL's clusters not yet split off."""
        return export.active_clusters(self.client_state, self.num_clusters)

    def cluster_module(self, k: int) -> pl.LightningModule:
        """Cluster k's trained model as the user's LightningModule (its own class, forward,
        hyper-parameters and ``configure_optimizers``), a copy detached from the trainer on this
        module's device. With ``shared_layers`` the copy holds the shared layers too (its own copy).
        An inactive cluster (removed by FedRC's adaptive K, or a CFL cluster not split off yet) is
        refused: it holds no trained model of any client group."""
        return export.cluster_module(self.models, self.active_clusters(), k)

    def export_clusters(self, directory: str | Path) -> dict[int, Path]:
        """Write ``cluster_{k}.ckpt`` for every active cluster k into ``directory`` (created if
        needed): Lightning checkpoints that ``MyModule.load_from_checkpoint(path)`` loads, the
        weights of cluster k and the hyper-parameters of the module you passed. Inactive clusters
        are skipped with a warning. Only global rank 0 writes. Returns {k: path} of the active ones."""
        trainer = attached_trainer(self)
        rank = 0 if trainer is None else trainer.global_rank
        return export.export_clusters(self.models, self.active_clusters(), directory, rank)
