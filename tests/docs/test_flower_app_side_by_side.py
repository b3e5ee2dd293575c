"""benchmarks/flower_app_side_by_side.py runs end to end with tiny arguments: both executors of the
library and the plain Flower app (Ray) train, the table has a row for each, and the two executors,
which take the same batches, reach the same held-out accuracy."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.docs.markdown_blocks import ROOT


@pytest.mark.slow
def test_the_side_by_side_prints_a_row_per_side_with_accuracies():
    command = [sys.executable, str(ROOT / "benchmarks" / "flower_app_side_by_side.py"),
               "--workloads", "W2", "--rounds", "2", "--clients", "6"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("machine: "), out[:500]
    assert "W2: 6 clients" in out
    accuracy = {}
    for name in ("this library (loop)", "this library (vectorized)", "Flower app (Ray, defaults)"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        numbers = [float(x) for x in re.findall(r"\d+\.\d+|\d+", line[len(name) :])]
        wall, cpu, start_end, rss, accuracy[name] = numbers
        assert wall > 0 and cpu > 0 and start_end > 0 and rss > 100, line
        assert 0.4 < accuracy[name] <= 1.0, line  # better than chance on the binary task
    assert accuracy["this library (loop)"] == accuracy["this library (vectorized)"]
    assert "Flower / this library (loop): CPU s/round" in out
