"""ClusterMonitor: writes each round's metrics with the round as the step, and, for TensorBoard,
the clients × clusters ω matrix, C_{y,k}, and the concept × cluster shares as images.

The ClusteredModule adds it automatically (configure_callbacks). Scalars go to every logger;
images only to loggers whose experiment has ``add_image`` (TensorBoard).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor

from lightning_fedcluster.metrics.clustering import concept_shares


def matrix_image(matrix: Tensor, cell_height: int, cell_width: int) -> Tensor:
    """A [rows, cols] matrix as a [1, H, W] grayscale image in [0, 1] (scaled by its maximum)."""
    scaled = matrix.double() / matrix.max().clamp_min(1e-12)
    image = scaled.repeat_interleave(cell_height, 0).repeat_interleave(cell_width, 1)
    return image.float().unsqueeze(0).clamp(0, 1)


class ClusterMonitor(pl.Callback):
    """Per-round logging. ``images_every``: write the images every this many rounds."""

    def __init__(self, images_every: int = 1) -> None:
        if images_every < 1:
            raise ValueError(f"images_every must be >= 1, got {images_every}")
        self.images_every = images_every

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
        if step % self.images_every == 0:
            order = torch.argsort(dm.metadata.concept, stable=True)
            self._log_image(
                trainer,
                "clusters/omega_clients_by_concept",
                matrix_image(state.omega[order], max(1, 240 // state.num_clients), 32),
                step,
            )
            self._log_image(trainer, "clusters/concept_shares", matrix_image(shares, 32, 32), step)
            stats = pl_module.rule.log_label_stats(state)
            if stats is not None:
                self._log_image(trainer, "clusters/label_stats_C", matrix_image(stats.exp(), 16, 32), step)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._log_scalars(trainer, dict(getattr(pl_module, "eval_metrics", {})), trainer.current_epoch + 1)

    @staticmethod
    def _log_scalars(trainer: pl.Trainer, metrics: dict[str, float], step: int) -> None:
        if not trainer.is_global_zero or not metrics:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    @staticmethod
    def _log_image(trainer: pl.Trainer, tag: str, image: Tensor, step: int) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            add_image = getattr(getattr(logger, "experiment", None), "add_image", None)
            if callable(add_image):
                add_image(tag, image, global_step=step)
