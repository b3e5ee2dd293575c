"""metrics/undefined.py: a NaN metric is never logged without a warning that names it and why."""

from __future__ import annotations

import math
import warnings

import pytest

from lightning_fedcluster.metrics.undefined import NOT_FINITE, nan_metrics, warn_nan_metrics


def test_nan_metrics_lists_only_the_nan_ones_in_order():
    assert nan_metrics({"a": 1.0, "b": math.nan, "c": math.inf, "d": math.nan}) == ["b", "d"]


def test_each_nan_metric_is_named_with_its_cause_or_the_generic_one():
    metrics = {"val/local_acc": 0.5, "val/global_acc": math.nan, "train/loss": math.nan}
    with pytest.warns(UserWarning, match="2 metric") as caught:
        names = warn_nan_metrics(metrics, {"val/global_acc": "no global clients"})
    assert names == ["val/global_acc", "train/loss"]
    message = str(caught[0].message)
    assert "val/global_acc: no global clients" in message
    assert f"train/loss: {NOT_FINITE}" in message
    assert "val/local_acc" not in message


def test_finite_metrics_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_nan_metrics({"a": 0.0, "b": 1.0}, {"a": "never"}) == []
