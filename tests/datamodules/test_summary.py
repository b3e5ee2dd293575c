"""Scenario diagnostics: the table, the figure, and the DataSummary callback's TensorBoard events."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.callbacks import DataSummary
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.datamodules.datasets.fedsoft_synthetic import FedSoftSynthetic
from lightning_fedcluster.datamodules.summary import (
    client_rows,
    client_type_counts,
    format_summary,
    label_counts,
    summary_figure,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


@pytest.fixture(scope="module")
def digits() -> DigitsFederated:
    return DigitsFederated(num_clients=8, seed=0)


def test_rows_match_the_data(digits: DigitsFederated) -> None:
    rows = client_rows(digits)
    assert len(rows) == 8
    counts = label_counts(digits)
    assert counts.shape == (8, 10)
    for i, row in enumerate(rows):
        y = torch.cat([digits.train_split(i)[1], digits.val_split(i)[1], digits.test_split(i)[1]])
        assert torch.equal(counts[i], torch.bincount(y, minlength=10))
        assert row["train_size"] == int(digits.train_sizes[i])
        assert row["concept"] == int(digits.metadata.concept[i])
        assert row["feature_style"] == digits.metadata.feature_style[i]
        assert sum(row["label_shares"]) == pytest.approx(1.0, abs=1e-3)
    types = client_type_counts(digits)
    assert sum(types.values()) == 8
    assert sum(n for (c, _), n in types.items() if c == 0) == int((digits.metadata.concept == 0).sum())
    assert label_counts(digits, "global").sum() == digits.global_y.numel()
    with pytest.raises(ValueError, match="split must be"):
        label_counts(digits, "held_out")


def test_table_text(digits: DigitsFederated) -> None:
    text = format_summary(digits, max_rows=3)
    assert "top labels" in text and "... 5 more clients" in text
    assert "global test clients: #0 concept 0" in text
    assert text.count("\n") > 8


def test_regression_summary() -> None:
    dm = FedSoftSynthetic(num_clients=4, global_test_size=10, seed=0)
    rows = client_rows(dm)
    assert "target_mean" in rows[0] and len(rows[0]["mixture"]) == 2
    assert "mixture" in format_summary(dm)
    with pytest.raises(ValueError, match="regression task"):
        label_counts(dm)
    summary_figure(dm)  # renders without label counts


def test_figure_has_three_panels(digits: DigitsFederated) -> None:
    pytest.importorskip("matplotlib")
    fig = summary_figure(digits)
    assert len(fig.axes) == 3


def test_callback_writes_the_figure_to_tensorboard(digits: DigitsFederated, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    logger = TensorBoardLogger(str(tmp_path), name="run")
    trainer = make_trainer(
        FedRCStrategy(num_clusters=2, clients_per_round=2, local_steps=1),
        max_epochs=1,
        logger=[logger, CSVLogger(str(tmp_path))],
        callbacks=[DataSummary()],
        limit_val_batches=0,
    )
    trainer.fit(MLPClassifier(), datamodule=digits)
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert "data/summary" in events.Tags()["images"]
    image = events.Images("data/summary")[0]
    assert image.width > 500 and image.height > 200 and image.step == 0
    assert "data/summary_table/text_summary" in events.Tags()["tensors"]


def test_callback_validates_max_rows() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        DataSummary(max_rows=0)
