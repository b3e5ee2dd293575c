"""The take-off study's configurations and job list as a user reads them: ``benchmarks/takeoff_runs.py``
run as a subprocess (``configs``, ``run --list``), so that the tests never import ``benchmarks/``."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "takeoff_runs.py"


def run_script(*arguments: str) -> str:
    """``takeoff_runs.py``'s standard output for ``arguments`` (a failure raises, with its stderr)."""
    command = [sys.executable, str(SCRIPT), *arguments]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout


@functools.cache
def takeoff_configs() -> dict[str, tuple[str, int, dict[str, Any]]]:
    """Every configuration: (strategy kind, the K it starts from, its FedRC options)."""
    printed = json.loads(run_script("configs"))
    return {name: (c["kind"], c["k_start"], c["options"]) for name, c in printed.items()}


def listed_jobs(data_root: Path, *options: str) -> list[str]:
    """The job names (configuration/cell/seed) that ``run --list`` prints with ``options``."""
    out = str(data_root / "jobs.jsonl")
    return run_script("run", "--data-root", str(data_root), "--out", out, "--list", *options).split()
