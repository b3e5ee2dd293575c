"""cli_errors.py: every bad --data file, class name and argument is reported by the real entry
point (``fedcluster`` = ``cli.main``) in two lines, the library's own message or a "did you
mean" first; jsonargparse's report or the traceback only with FEDCLUSTER_DEBUG=1."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_fedcluster.cli import main
from lightning_fedcluster.cli_errors import DEBUG_ENV, summarize


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> list[str]:
    """``fedcluster fit ARGS`` in this process; returns its stderr lines (it must exit with 2)."""
    monkeypatch.setattr(
        sys, "argv", ["fedcluster", "fit", *args, "--trainer.max_epochs=1", "--trainer.logger=false"]
    )
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    return [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("Seed set")]


@pytest.fixture
def npz_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.savez("mismatch.npz", x=rng.random((100, 64), dtype=np.float32), y=rng.integers(0, 10, 90))
    np.savez("keys.npz", features=rng.random((100, 64), dtype=np.float32), target=rng.integers(0, 10, 100))
    return tmp_path


CASES = {
    "missing file": (
        ["--data", "no_such_file.pt"],
        "error: TensorFileFederated: path='no_such_file.pt': no such file",
    ),
    "mismatched npz": (
        ["--data", "mismatch.npz"],
        "error: TensorFileFederated: y must be 1-D with one label per row",
    ),
    "wrongly keyed npz": (
        ["--data", "keys.npz"],
        "error: TensorFileFederated: keys.npz: needs tensors 'x' and 'y'",
    ),
    "strategy class": (
        ["--trainer.strategy", "FedRCStrateg"],
        "error: strategy='FedRCStrateg' is not a registered strategy: lightning-fedcluster's are fedrc,",
    ),
    "strategy argument": (
        ["--trainer.strategy.init_args.num_cluster", "3"],
        "error: --trainer.strategy: FedRCStrategy has no argument 'num_cluster'; did you mean num_clusters?",
    ),
    "strategy value": (
        ["--trainer.strategy.num_clusters", "0"],
        "error: FedRCStrategy: num_clusters must be an integer >= 1, got 0",
    ),
    "data argument": (
        ["--data.num_client", "10"],
        "error: --data: DigitsFederated has no argument 'num_client'; did you mean num_clients?",
    ),
    "data class": (
        ["--data", "DigitsFederate"],
        "error: --data: no class named 'DigitsFederate'; did you mean DigitsFederated?",
    ),
    "model class": (
        ["--model", "MLPClasifier"],
        "error: --model: no class named 'MLPClasifier'; did you mean MLPClassifier?",
    ),
    "trainer option": (
        ["--trainer.max_epochz", "3"],
        "error: unknown option --trainer.max_epochz; did you mean --trainer.max_epochs?",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_command_line_is_reported_first_in_two_lines(case, npz_files, monkeypatch, capsys):
    args, first = CASES[case]
    lines = run_main(monkeypatch, capsys, *args)
    assert lines[0] == first or lines[0].startswith(first), lines
    if case == "strategy class":
        assert lines[0].endswith("; did you mean FedRCStrategy?")
    assert len(lines) == 2 and DEBUG_ENV in lines[1], lines  # the second line: where the full report is


def test_the_full_report_on_request(npz_files, monkeypatch, capsys):
    monkeypatch.setenv(DEBUG_ENV, "1")
    monkeypatch.setattr(sys, "argv", ["fedcluster", "fit", "--data", "no_such_file.pt"])
    with pytest.raises(ValueError, match="Does not validate against any of the Union subtypes") as caught:
        main()
    assert isinstance(caught.value.__cause__, FileNotFoundError)  # the traceback names the cause too
    monkeypatch.setattr(sys, "argv", ["fedcluster", "fit", "--data.num_client", "3"])
    with pytest.raises(SystemExit):
        main()
    assert "Does not validate against any of the Union subtypes" in capsys.readouterr().err


def test_summarize_keeps_an_unknown_message_whole():
    assert summarize("something else went wrong\nsecond line") == "something else went wrong; second line"
