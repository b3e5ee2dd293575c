"""A quiet console: the quick start prints no warning the library causes and no DDP banner, the
progress is one bar over rounds (bounded output without a terminal), and Lightning's batch
limits either mean something for rounds or are refused by name."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import lightning_fedcluster as lf
from lightning_fedcluster.callbacks import ClusterMonitor, RoundProgressBar
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

ROOT = Path(__file__).parent.parent.parent

# The four warnings the quick start printed before, and the single-process DDP banner.
LIBRARY_CAUSED = (
    "args parameter is intended to run from within Python",
    "is smaller than the logging interval",
    "will override existing callbacks",
    "Initializing distributed",
    "Starting with 1 processes",
    "DataSummary logs the table only",  # the CLI's DataSummary needs matplotlib for its figure
)


def _strategy(**options) -> lf.FedRCStrategy:
    return lf.FedRCStrategy(num_clusters=2, local_steps=2, clients_per_round=4, **options)


def _datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=8, concepts=2, dirichlet_alpha=1.0, seed=0)


def test_the_quick_start_console_has_no_library_warning_and_bounded_progress(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_fedcluster.cli",
            "fit",
            "--trainer.max_epochs=6",
            "--trainer.check_val_every_n_epoch=3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    for text in LIBRARY_CAUSED:
        assert text not in output
    # any warning raised from the library's own files would be printed with its path
    assert not re.search(r"lightning_fedcluster/\S+\.py:\d+: ", output), output
    # no epoch or per-client validation bars: one line per round at most, here every round (6 <= 10)
    assert "Validation DataLoader" not in output and "Epoch 0" not in output
    rounds = [line for line in done.stdout.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in rounds] == [f"{t}/6" for t in range(1, 7)]
    assert "clients 60" in rounds[-1] and "rounds/s" in rounds[-1] and "val/global_acc" in rounds[-1]
    assert len(done.stdout.splitlines()) < 30
    assert "TensorBoard logs:" in done.stdout


def test_without_a_terminal_the_bar_prints_at_most_lines_plus_the_last_round():
    stream = io.StringIO()
    trainer = make_trainer(_strategy(), 7, enable_progress_bar=True, callbacks=[RoundProgressBar(3, stream)])
    trainer.fit(MLPClassifier(), datamodule=_datamodule())
    lines = stream.getvalue().splitlines()
    # every ceil(7/3) rounds, and the last
    assert [line.split()[1] for line in lines] == ["3/7", "6/7", "7/7"]
    assert lines[-1].startswith("round 7/7  clients 28  ") and "train/loss" in lines[-1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_counts_rounds_in_place():
    stream = _Terminal()
    bar = RoundProgressBar(stream=stream)
    trainer = make_trainer(_strategy(), 3, enable_progress_bar=True, callbacks=[bar])
    trainer.fit(MLPClassifier(), datamodule=_datamodule())
    text = stream.getvalue()
    assert "round: 100%" in text and "3/3" in text and "clients 12" in text and "round/s" in text
    assert "\n" not in text.rstrip("\n")  # redrawn in place (carriage returns), one line in the end


def test_a_trainer_s_own_cluster_monitor_is_kept_without_an_override_warning():
    monitor = ClusterMonitor(images_every=5)
    trainer = make_trainer(_strategy(), 1, callbacks=[monitor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=_datamodule())
        trainer.test(trainer.lightning_module, datamodule=_datamodule(), verbose=False)
    assert [c for c in trainer.callbacks if isinstance(c, ClusterMonitor)] == [monitor]
    assert not [w for w in caught if "override existing callbacks" in str(w.message)]


def test_fit_then_test_adds_one_cluster_monitor_and_warns_nothing():
    trainer = make_trainer(_strategy(), 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=_datamodule())
        trainer.test(trainer.lightning_module, datamodule=_datamodule(), verbose=False)
    assert sum(isinstance(c, ClusterMonitor) for c in trainer.callbacks) == 1
    assert not [w for w in caught if "override existing callbacks" in str(w.message)]


@pytest.mark.parametrize(
    ("flag", "value", "advice"),
    [
        ("limit_train_batches", 0.5, "clients_per_round"),
        ("limit_train_batches", 3, "max_epochs"),
        ("overfit_batches", 2, "overfit_batches=2"),
    ],
)
def test_batch_limits_that_would_cut_rounds_are_refused_before_training(flag, value, advice):
    trainer = make_trainer(_strategy(), 2, **{flag: value})
    module = MLPClassifier()
    with pytest.raises(ValueError, match=advice):
        trainer.fit(module, datamodule=_datamodule())
    assert trainer.global_step == 0


def test_fast_dev_run_trains_one_short_round_and_evaluates_every_client():
    dm = _datamodule()
    trainer = make_trainer(_strategy(executor="vectorized"), 5, fast_dev_run=True)
    trainer.fit(MLPClassifier(), datamodule=dm)
    assert trainer.current_epoch == 1 and trainer.global_step == 4 * 2  # the round's one chunk: 4 clients
    # the validation inside fit scored every client (cut after one item, the unseen ones read 0.0)
    metrics = trainer.lightning_module.eval_metrics
    assert metrics["val/global_acc"] > 0.0 and metrics["val/local_acc"] > 0.0
    assert all(metrics[f"val/global_acc_concept{c}"] > 0.0 for c in range(2))
    tested = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    assert tested["test/global_acc"] > 0.0 and tested["test/local_acc"] > 0.0
