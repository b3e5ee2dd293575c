"""engine/threads.py: a fit runs small per-client work on one intra-op thread (many threads on a
busy machine made the quick start 3x slower), says so, and keeps what the user set: the
strategy's ``num_threads``, ``OMP_NUM_THREADS``, or a ``torch.set_num_threads`` count. torch's
count is back to what it was after the fit."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine import threads
from lightning_fedcluster.engine.threads import SMALL_STEP_FLOPS, choose_threads, step_flops
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


class _Seen(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        self.threads = torch.get_num_threads()


@pytest.fixture
def untouched_threads(monkeypatch):
    """A process as a user starts it: no OMP_NUM_THREADS, torch's own count of 2 threads."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "IMPORTED_THREADS", 2)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _fit(strategy) -> int:
    seen = _Seen()
    trainer = make_trainer(strategy, max_epochs=1, limit_val_batches=0, callbacks=[seen])
    trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=4, seed=0))
    return seen.threads


def test_the_quick_start_model_is_small_work():
    flops = step_flops(MLPClassifier(), torch.zeros(1, 64), batch_rows=32, models_trained=3)
    assert 3e6 < flops < 1e7 and flops < SMALL_STEP_FLOPS  # 3 x 2 x 9,546 weights x 32 rows x 3


def test_a_fit_of_small_work_runs_on_one_thread_says_so_and_restores_torchs_count(untouched_threads, caplog):
    with caplog.at_level(logging.INFO):
        logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.INFO)
        try:
            assert _fit(lf.FedAvgStrategy(local_steps=1)) == 1
        finally:
            logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.ERROR)
    assert torch.get_num_threads() == 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("intra-op threads")]
    assert (
        said and said[0].startswith("intra-op threads: 1 (a local step is about") and "num_threads" in said[0]
    )


def test_num_threads_overrides_the_engines_choice(untouched_threads):
    assert _fit(lf.FedAvgStrategy(local_steps=1, num_threads=2)) == 2
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_num_threads_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="num_threads"):
        lf.FedAvgStrategy(num_threads=value)


def test_the_users_setting_comes_before_the_engines_choice(untouched_threads):
    small = SMALL_STEP_FLOPS / 10
    assert choose_threads(None, None, small).threads == 1
    assert choose_threads(None, None, SMALL_STEP_FLOPS * 10).threads == 2  # torch's count
    assert choose_threads(3, "1", small).threads == 3  # num_threads first
    assert choose_threads(None, "2", small) == threads.ThreadChoice(2, "OMP_NUM_THREADS=2")
    torch.set_num_threads(3)  # the user's own count, set after importing the library
    assert choose_threads(None, None, small).threads == 3
