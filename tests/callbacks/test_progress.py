"""callbacks/progress.py: a quiet console: the quick start prints no warning the library causes and
no DDP banner, and the progress is one bar over rounds (bounded output without a terminal)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from lightning_fedcluster.callbacks import RoundProgressBar
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.small_run import small_datamodule, small_strategy

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
    # any warning raised from the library's own files would be printed with its path: here only
    # the one that the main job's round options lie past these 6 rounds
    (library,) = re.findall(r"lightning_fedcluster/\S+\.py:\d+: (.*)", output) or [output]
    assert library.startswith("group_round=20, group_late_round=25, omega_weighting_from=20 leave no")
    assert "max_epochs=6" in library
    # no epoch or per-client validation bars: one line per round at most, here every round (6 <= 10)
    assert "Validation DataLoader" not in output and "Epoch 0" not in output
    rounds = [line for line in done.stdout.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in rounds] == [f"{t}/6" for t in range(1, 7)]
    assert "clients 10 " in rounds[-1] and "rounds/s" in rounds[-1] and "val/global_acc" in rounds[-1]
    assert rounds[-1].endswith("(validated at round 6)") and rounds[4].endswith("(validated at round 3)")
    assert len(done.stdout.splitlines()) < 30
    assert "TensorBoard logs:" in done.stdout


def test_without_a_terminal_the_bar_prints_at_most_lines_plus_the_last_round():
    stream = io.StringIO()
    trainer = make_trainer(
        small_strategy(), 7, enable_progress_bar=True, callbacks=[RoundProgressBar(3, stream)]
    )
    trainer.fit(MLPClassifier(), datamodule=small_datamodule())
    lines = stream.getvalue().splitlines()
    # every ceil(7/3) rounds, and the last
    assert [line.split()[1] for line in lines] == ["3/7", "6/7", "7/7"]
    assert lines[-1].startswith("round 7/7  clients 4  ") and "train/loss" in lines[-1]


def test_validation_scores_name_the_round_they_are_from_and_clients_are_per_round():
    """Rounds without validation showed the last validation's scores with no round attached, and
    "clients" was a running total (Flower's progress counts per round)."""
    stream = io.StringIO()
    trainer = make_trainer(
        small_strategy(), 7, enable_progress_bar=True, callbacks=[RoundProgressBar(7, stream)],
        check_val_every_n_epoch=3,
    )  # fmt: skip
    trainer.fit(MLPClassifier(), datamodule=small_datamodule())
    lines = stream.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["4"] * 7  # 4 clients a round
    assert "val/" not in lines[1] and "val/local_acc" in lines[2]
    assert [line.endswith("(validated at round 3)") for line in lines] == [
        False,
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert lines[5].endswith("(validated at round 6)") and lines[6].endswith("(validated at round 6)")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_counts_rounds_in_place():
    stream = _Terminal()
    bar = RoundProgressBar(stream=stream)
    trainer = make_trainer(small_strategy(), 3, enable_progress_bar=True, callbacks=[bar])
    trainer.fit(MLPClassifier(), datamodule=small_datamodule())
    text = stream.getvalue()
    assert "round: 100%" in text and "3/3" in text and "clients 4" in text and "round/s" in text
    assert "\n" not in text.rstrip("\n")  # redrawn in place (carriage returns), one line in the end
