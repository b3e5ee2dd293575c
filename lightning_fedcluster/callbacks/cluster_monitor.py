"""ClusterMonitor: writes each round's metrics with the round as the step and, for loggers that take
images (TensorBoard), figures of how the clusters relate to the true concepts.

The ClusteredModule adds it automatically (configure_callbacks). Scalars go to every logger. The
figures (drawn by `lightning_fedcluster.figures`) are: the clients × clusters ω matrix, the
concept × cluster shares, C_{y,k} (FedRC), and the validation accuracy per concept over rounds.
They are drawn at every validation round and at the end of training (rendering a figure costs
far more than a round of the small models), or every ``images_every`` rounds when given.
"""

from __future__ import annotations

import re
from typing import Any

import lightning.pytorch as pl
from matplotlib.figure import Figure

from lightning_fedcluster import figures
from lightning_fedcluster.callbacks.image_logging import log_figure
from lightning_fedcluster.metrics.clustering import concept_shares

CONCEPT_METRIC = re.compile(r"^val/global_(acc|mse)_concept(\d+)$")
"""The validation metric of each concept's global client, as the evaluation names it."""


class ClusterMonitor(pl.Callback):
    """Per-round logging.

    Args:
        images_every: also draw the cluster figures every this many rounds (None: only at
            validation rounds and at the end of training).
    """

    def __init__(self, images_every: int | None = None) -> None:
        if images_every is not None and (isinstance(images_every, bool) or images_every < 1):
            raise ValueError(f"images_every must be a positive integer or None, got {images_every!r}")
        self.images_every = images_every
        self.history: dict[int, dict[str, float]] = {}
        """Validation metrics per round, for the accuracy-over-rounds figure (kept in checkpoints)."""
        self._last_round: int | None = None
        self._drawn_round: int | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.current_epoch + 1
        metrics = dict(getattr(pl_module, "round_metrics", {}))
        state = getattr(pl_module, "client_state", None)
        if state is None or not metrics:
            return
        dm = trainer.datamodule
        shares = concept_shares(state.omega, dm.metadata.concept, dm.train_sizes)
        for c in range(shares.shape[0]):
            for k in range(shares.shape[1]):
                metrics[f"clusters/concept{c}_share_in_cluster{k}"] = float(shares[c, k])
        self._log_scalars(trainer, metrics, step)
        self._last_round = step
        if self.images_every is not None and step % self.images_every == 0:
            self._draw_clusters(trainer, pl_module, step)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step = trainer.current_epoch + 1
        metrics = dict(getattr(pl_module, "eval_metrics", {}))
        self._log_scalars(trainer, metrics, step)
        if not metrics:
            return
        self.history[step] = {name: float(v) for name, v in metrics.items() if name.startswith("val/")}
        self._draw_clusters(trainer, pl_module, step)
        log_figure(trainer, "val/per_concept", self._accuracy_figure, step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last_round is not None and self._drawn_round != self._last_round:
            self._draw_clusters(trainer, pl_module, self._last_round)

    def state_dict(self) -> dict[str, Any]:
        return {"history": {step: dict(metrics) for step, metrics in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {int(step): dict(metrics) for step, metrics in state_dict.get("history", {}).items()}

    def _draw_clusters(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> None:
        """ω sorted by concept, the concept × cluster shares and, for FedRC, C_{y,k}."""
        state = getattr(pl_module, "client_state", None)
        if state is None or self._drawn_round == step:
            return
        self._drawn_round = step
        concept, sizes = trainer.datamodule.metadata.concept, trainer.datamodule.train_sizes
        log_figure(
            trainer,
            "clusters/omega_clients_by_concept",
            lambda: figures.omega_figure(state.omega, concept, step, state.seen),
            step,
        )
        log_figure(
            trainer,
            "clusters/concept_shares",
            lambda: figures.shares_figure(concept_shares(state.omega, concept, sizes), step),
            step,
        )
        log_figure(trainer, "clusters/label_stats_C", lambda: self._label_stats_figure(pl_module, step), step)

    @staticmethod
    def _label_stats_figure(pl_module: pl.LightningModule, step: int) -> Figure | None:
        stats = pl_module.rule.log_label_stats(pl_module.client_state)
        return None if stats is None else figures.label_stats_figure(stats.exp(), step)

    def _accuracy_figure(self) -> Figure | None:
        per_concept: dict[int, str] = {}
        for metrics in self.history.values():
            for name in metrics:
                match = CONCEPT_METRIC.match(name)
                if match:
                    per_concept[int(match.group(2))] = name
        if not per_concept:
            return None
        mean = next(iter(per_concept.values())).rsplit("_concept", 1)[0]
        return figures.accuracy_figure(self.history, per_concept, mean)

    @staticmethod
    def _log_scalars(trainer: pl.Trainer, metrics: dict[str, float], step: int) -> None:
        if not trainer.is_global_zero or not metrics:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
