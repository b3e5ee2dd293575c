"""The documented `benchmarks/takeoff_data.py` command writes the take-off cells with the
recorded arguments: a1 (digits, the authors' skew) and a10 (Dir(1.0) per class) as their
manifests say, and m10-one's command (``--print`` shows it) puts every client in concept 0."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.docs.markdown_blocks import ROOT

SCRIPT = ROOT / "benchmarks" / "takeoff_data.py"


def test_takeoff_data_writes_the_digits_cells_as_recorded(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--data-root", str(tmp_path), "--only", "a1", "a10"],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    a1 = json.loads((tmp_path / "a1" / "manifest.json").read_text())
    a10 = json.loads((tmp_path / "a10" / "manifest.json").read_text())
    assert (a1["dataset"], a1["dirichlet_alpha"], len(a1["clients"])) == ("digits", 1.0, 25)
    assert (a10["dataset"], a10["dirichlet_alpha"], len(a10["clients"])) == ("digits", 10.0, 25)
    assert "--alpha 10" in a10["command"] and "--alpha" not in a1["command"]
    assert a1["sha256"] != a10["sha256"]


def test_takeoff_data_rejects_an_unknown_cell(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--data-root", str(tmp_path), "--only", "m5"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "invalid choice: 'm5'" in done.stderr


def test_the_one_concept_command_puts_every_client_in_concept_0(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--data-root", str(tmp_path), "--only", "m10-one",
                           "--print"], capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    (line,) = done.stdout.splitlines()
    command = line.removeprefix("+ ").split()
    assert command[:3] == ["python", str(SCRIPT.parent / "authors_comparison.py"), "write"]
    at = command.index("--concept-proportions")
    assert command[at + 1 : at + 4] == ["1", "0", "0"]
    assert command[command.index("--out") + 1] == str(tmp_path / "m10-one")
    assert not (tmp_path / "m10-one").exists()  # --print writes nothing
