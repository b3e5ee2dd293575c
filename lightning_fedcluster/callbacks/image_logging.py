"""Sending rendered figures to the loggers that take images.

A logger takes images when its ``experiment`` has ``add_image`` (TensorBoard's SummaryWriter and
writers with its API). Other loggers (CSVLogger, ...) are skipped without error, and a figure is
drawn only when some logger will take it, so runs without TensorBoard pay nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from matplotlib.figure import Figure

from lightning_fedcluster.figures import render


def experiments_with(trainer: pl.Trainer, method: str) -> list[Any]:
    """The experiments of the trainer's loggers that have a callable ``method`` (e.g. "add_image");
    empty on every process but rank 0."""
    if not trainer.is_global_zero:
        return []
    experiments = (getattr(logger, "experiment", None) for logger in trainer.loggers)
    return [e for e in experiments if callable(getattr(e, method, None))]


def log_figure(trainer: pl.Trainer, tag: str, draw: Callable[[], Figure | None], step: int) -> None:
    """Draw the figure (only if a logger takes images), render it to RGB and log it at `step`.
    ``draw`` may return None when there is nothing to show."""
    experiments = experiments_with(trainer, "add_image")
    if not experiments:
        return
    figure = draw()
    if figure is None:
        return
    image = render(figure)
    figure.clear()
    for experiment in experiments:
        experiment.add_image(tag, image, global_step=step, dataformats="HWC")
