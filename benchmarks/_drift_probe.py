"""What moves a client after the concept grouping: ``TakeoffDiagnostics`` from a given round on,
plus what FedRC's E-step score is made of (for ``authors_comparison.py run --diagnostics-from``).

Each recorded row also holds log C_{y,k} (``log_label_stats`` [C, K], what the clients use in the
next round's E-step), and per client the mean loss of each cluster model over its rows of each
label (``label_losses`` [M, C, K]) with the row counts: a client's E-step score of cluster k is
Σ_y n_y (−loss_{y,k} − log C_{y,k}) / N, so the two parts can be told apart offline.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.algorithms.signatures import label_conditioned_means
from lightning_fedcluster.callbacks.takeoff_diagnostics import TakeoffDiagnostics


class DriftDiagnostics(TakeoffDiagnostics):
    """``TakeoffDiagnostics`` from round ``start`` on (earlier rounds cost nothing), with the
    E-step's parts (module docstring)."""

    def __init__(self, start: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start = start

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.start:
            super().on_train_epoch_end(trainer, pl_module)

    @torch.no_grad()
    def measure(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        row = super().measure(trainer, pl_module)
        dm = trainer.datamodule
        log_stats = label_statistics(pl_module.rule, pl_module.client_state)
        row["log_label_stats"] = None if log_stats is None else log_stats.cpu().double().tolist()
        losses_by_label = []
        for i in range(dm.num_clients):
            x, y = pl_module.split("train", i)
            losses, _ = pl_module.evaluate_clusters(x, y)
            losses_by_label.append(label_conditioned_means(losses.cpu().double(), y.cpu(), dm.num_classes)[0])
        row["label_losses"] = torch.stack(losses_by_label).tolist()
        return row
