"""Tests of the benchmarks' own code: the helpers their scripts share (``_common.py``), the
take-off study's diagnostic rule and callback (``_takeoff_variants.py``, ``fall_probe.py``).

They live beside the benchmarks, not in the package's ``tests/``, because what they check is no part
of the package: the package's tests never import ``benchmarks/`` (it may import the package, never
the reverse). pytest runs them with the package's tests (``testpaths`` in ``pyproject.toml``). The
benchmark scripts import each other by file name, as they do when run, so this folder's parent is
put on ``sys.path`` here, once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))


@pytest.fixture
def threads_restored(monkeypatch):
    """A script that pins one torch thread and ``OMP_NUM_THREADS`` (``set_threads``) leaves both as
    they were for the next test."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
