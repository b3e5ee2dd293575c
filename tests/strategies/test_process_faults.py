"""A fit's processes when something goes wrong: SIGTERM stops the fit with status 143 (not 0),
leaving the last round-end checkpoint to resume from exactly; the collective timeout can be set
(in seconds) and a stopped peer fails the other process within it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.models import MLPClassifier
from lightning_fedcluster.strategies.process_faults import SIGTERM_EXIT_STATUS
from tests.conftest import make_trainer
from tests.flower import workload

ROOT = Path(__file__).resolve().parents[2]


def strategy(**options) -> FedRCStrategy:
    return FedRCStrategy(2, clients_per_round=4, local_steps=2, seed=2, **options)


def test_the_collective_timeout_takes_seconds_or_a_timedelta():
    assert strategy(timeout=7)._timeout == timedelta(seconds=7)
    assert strategy(timeout=timedelta(minutes=2))._timeout == timedelta(minutes=2)
    assert strategy()._timeout == timedelta(minutes=30), "Lightning's default"
    for bad in (0, -1.0, "soon", True):
        with pytest.raises(
            ValueError, match="timeout must be a number of seconds > 0 or a datetime.timedelta"
        ):
            strategy(timeout=bad)


class TerminateAfterRound(pl.Callback):
    """Sends this process SIGTERM once round ``round_index`` has ended (and been checkpointed)."""

    def __init__(self, round_index: int) -> None:
        self.round_index = round_index

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.round_index:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def default_sigterm():
    """The process's default SIGTERM disposition during the test: Lightning chains a handler it
    finds installed (Flower's simulation leaves its own, which exits with status 15), and a fresh
    `fedcluster fit` process has none."""
    saved = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, saved)


def test_sigterm_stops_the_fit_with_status_143_and_the_last_round_resumes_exactly(tmp_path, default_sigterm):
    saver = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_on_train_epoch_end=True)
    stopped = make_trainer(
        strategy(), max_epochs=4, limit_val_batches=0, enable_checkpointing=True,
        callbacks=[saver, TerminateAfterRound(1)],
    )  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        stopped.fit(MLPClassifier(lr=0.2), datamodule=workload.make_datamodule())
    assert stop.value.code == SIGTERM_EXIT_STATUS == 143, "a scheduler must tell it from success"
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == 1, "round 1 was saved"
    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=workload.make_datamodule())
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(
        MLPClassifier(lr=0.2), datamodule=workload.make_datamodule(), ckpt_path=tmp_path / "last.ckpt"
    )
    for name, tensor in straight.lightning_module.state_dict().items():
        assert torch.equal(resumed.lightning_module.state_dict()[name], tensor), name


STOPPED_PEER = textwrap.dedent(
    """
    import os, signal, sys, time
    import lightning.pytorch as pl
    from lightning_fedcluster import FedAvgStrategy
    from lightning_fedcluster.models import MLPClassifier
    from tests.flower import workload

    class StopRankOne(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1 and trainer.global_rank == 1:
                print("rank 1 stops", time.time(), flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)

    trainer = pl.Trainer(
        strategy=FedAvgStrategy(local_steps=2, timeout=float(sys.argv[1])), accelerator="cpu", devices=2,
        max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[StopRankOne()],
    )
    trainer.fit(MLPClassifier(), datamodule=workload.make_datamodule())
    print("finished", flush=True)
    """
)


@pytest.mark.slow
def test_a_stopped_peer_fails_the_other_process_within_the_timeout(tmp_path):
    """Rank 1 stops itself (SIGSTOP) at round 1; rank 0 waits at the round's all-reduce and fails
    after timeout=45 s instead of Lightning's 30 minutes (the timeout also bounds the processes'
    start-up rendezvous, which takes over 10 s on a loaded 2-core machine)."""
    script, log = tmp_path / "stopped_peer.py", tmp_path / "output.log"
    script.write_text(STOPPED_PEER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        env.pop(name, None)
    with open(log, "w") as output:  # the stopped rank 1 keeps it open: no pipe to wait on
        process = subprocess.Popen(
            [sys.executable, str(script), "45"], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            process.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the launcher's group, with the stopped rank 1
                os.killpg(process.pid, signal.SIGKILL)
    ended, text = time.time(), log.read_text()
    assert process.returncode != 0 and "finished" not in text, text[-3000:]
    stopped_at = float(text.split("rank 1 stops", 1)[1].split()[0])
    assert ended - stopped_at < 300, "failed long before Lightning's 30-minute default"
    assert "Application timeout caused pair closure" in text, text[-3000:]
