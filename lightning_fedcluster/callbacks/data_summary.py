"""DataSummary: at fit start, log the scenario (per-client label mix, split sizes, client types) as
a figure and as a text table, to the loggers that take them (TensorBoard)."""

from __future__ import annotations

import lightning.pytorch as pl

from lightning_fedcluster.callbacks.image_logging import experiments_with, log_figure
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.summary import format_summary, summary_figure


class DataSummary(pl.Callback):
    """Logs `summary_figure` (tag "data/summary") and `format_summary` (tag "data/summary_table")
    once at fit start, at step 0, to every logger whose experiment has ``add_image`` /
    ``add_text`` (TensorBoard); other loggers are skipped.

    Args:
        print_table: also print the table to stdout (rank 0).
        max_rows: clients listed in the table.
        figures: log the figure (False: the table only).
    """

    def __init__(self, print_table: bool = False, max_rows: int | None = 50, figures: bool = True) -> None:
        bad = isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1
        if max_rows is not None and bad:
            raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
        self.print_table = print_table
        self.max_rows = max_rows
        self.figures = figures

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if not trainer.is_global_zero or not isinstance(dm, FederatedDataModule):
            return
        table = format_summary(dm, self.max_rows)
        if self.print_table:
            print(table, flush=True)
        if self.figures:
            log_figure(trainer, "data/summary", lambda: summary_figure(dm), step=0)
        for experiment in experiments_with(trainer, "add_text"):
            experiment.add_text("data/summary_table", "```\n" + table + "\n```", global_step=0)
