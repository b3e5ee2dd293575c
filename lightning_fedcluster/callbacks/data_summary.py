"""DataSummary: at fit start, log the scenario (per-client label mix, client types) to TensorBoard
as a figure and as a text table."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.summary import format_summary, summary_figure


class DataSummary(pl.Callback):
    """Logs `summary_figure` (tag "data/summary") and `format_summary` (tag "data/summary_table")
    once at fit start, to every TensorBoard logger (other loggers are skipped). Without
    matplotlib only the table is logged, with a warning.

    Args:
        print_table: also print the table to stdout (rank 0).
        max_rows: clients listed in the table.
    """

    def __init__(self, print_table: bool = False, max_rows: int | None = 50) -> None:
        bad = isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1
        if max_rows is not None and bad:
            raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
        self.print_table = print_table
        self.max_rows = max_rows

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if not trainer.is_global_zero or not isinstance(dm, FederatedDataModule):
            return
        table = format_summary(dm, self.max_rows)
        if self.print_table:
            print(table, flush=True)
        loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        if not loggers:
            return
        try:
            figure = summary_figure(dm)
        except ImportError as error:
            warnings.warn(f"DataSummary logs the table only: {error}", stacklevel=2)
            figure = None
        for logger in loggers:
            if figure is not None:
                logger.experiment.add_figure("data/summary", figure, global_step=0, close=False)
            logger.experiment.add_text("data/summary_table", "```\n" + table + "\n```", global_step=0)
