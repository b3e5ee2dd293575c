"""benchmarks/_common.py's ``set_threads``: the benchmarks' ``--threads`` must survive Lightning's
launcher, which (``_set_num_threads_if_needed``, called as the library's strategies launch) resets
torch's thread count to the cores per process unless ``OMP_NUM_THREADS`` is set. A plain
``torch.set_num_threads`` before the fit is overridden: takeoff_runs.py's two "one-thread" workers
each ran two threads on two cores before ``set_threads`` pinned both. The library's launchers now
keep a one-process fit's thread count themselves (``tests/strategies/test_launchers.py``); the
benchmarks still pin both, for their several-process runs."""

from __future__ import annotations

import os

import pytest
import torch
from _common import set_threads
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed, _suggested_max_num_threads


@pytest.fixture
def restore_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # monkeypatch restores the variable after
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_set_threads_survives_the_launcher_reset(restore_threads):
    set_threads(1)
    _set_num_threads_if_needed(num_processes=1)
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_a_plain_set_num_threads_does_not(restore_threads):
    torch.set_num_threads(1)
    _set_num_threads_if_needed(num_processes=1)
    assert torch.get_num_threads() == _suggested_max_num_threads(1)
