"""Metrics that come out NaN are never logged silently: one warning names each such metric and
why it is undefined (no rows to score, no unseen clients, fewer than two clients seen, or a loss
or prediction that was not finite)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from lightning.pytorch.utilities import rank_zero_warn

NOT_FINITE = (
    "a model's loss or prediction was not finite: training diverged (lower the learning rate) or the "
    "data hold NaN or inf values"
)


def nan_metrics(metrics: Mapping[str, float]) -> list[str]:
    """The names of the metrics whose value is NaN, in order."""
    return [name for name, value in metrics.items() if isinstance(value, float) and math.isnan(value)]


def warn_nan_metrics(metrics: Mapping[str, float], causes: Mapping[str, str] | None = None) -> list[str]:
    """Warn once for the NaN metrics about to be logged, each with its cause (``causes[name]``,
    else ``NOT_FINITE``); returns their names. Identical warnings are shown once per run."""
    names = nan_metrics(metrics)
    if names:
        causes = causes or {}
        lines = "; ".join(f"{name}: {causes.get(name, NOT_FINITE)}" for name in names)
        rank_zero_warn(f"{len(names)} metric(s) are NaN (undefined) and logged as such. {lines}")
    return names
