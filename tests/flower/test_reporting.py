"""flower/reporting.py: the server's progress line per round, its console logging (added once,
never over a configured handler) and the TensorBoard writer of the round metrics."""

from __future__ import annotations

import logging

import pytest

from lightning_fedcluster.flower import reporting
from lightning_fedcluster.flower.reporting import console_logging, progress_line, writer_for


def test_the_progress_line_shows_clients_rejections_training_and_validation_metrics():
    metrics = {"train/clients": 6.0, "train/rejected": 1.0, "train/loss": 0.123456, "train/acc": 0.5,
               "val/acc": 0.75, "other": 3.0}  # fmt: skip
    line = progress_line(2, 10, metrics, seconds=1.234)
    assert line == "round 3/10, 6 clients, 1 rejected, loss 0.1235, acc 0.5000, val/acc 0.7500, 1.23 s"
    assert (
        progress_line(0, 1, {"train/rejected": 0.0, "train/mse": 2.0}, 0.5) == "round 1/1, mse 2.0000, 0.50 s"
    )


@pytest.fixture
def clean_loggers(monkeypatch):
    """The library's logger without handlers and at WARNING, restored afterwards (a test empties
    the root logger's handlers itself: pytest adds its own for each phase)."""
    monkeypatch.setattr(reporting.log, "handlers", [])
    level = reporting.log.level
    reporting.log.setLevel(logging.WARNING)
    yield reporting.log
    reporting.log.setLevel(level)


def test_console_logging_adds_one_stdout_handler_at_info(clean_loggers, monkeypatch, capsys):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    console_logging()
    console_logging()  # once per process
    assert len(clean_loggers.handlers) == 1 and clean_loggers.level == logging.INFO
    clean_loggers.info("round done")
    assert capsys.readouterr().out == "INFO : fedcluster: round done\n"


def test_console_logging_leaves_a_configured_handler_alone(clean_loggers, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    console_logging()
    assert clean_loggers.handlers == [] and clean_loggers.level == logging.INFO


def test_a_writer_only_with_a_log_dir(tmp_path):
    assert writer_for(None) is None
    writer = writer_for(str(tmp_path))
    writer.add_scalar("train/loss", 0.5, 0)
    writer.close()
    assert any(path.name.startswith("events.out.tfevents") for path in tmp_path.iterdir())
