"""engine/checkpoint.py: resuming from a round checkpoint equals the uninterrupted run, including
algorithm-specific client state."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fedcluster import (
    CFLStrategy,
    FedRCStrategy,
    FedSoftStrategy,
)
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


@pytest.fixture(scope="module")
def small_digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_resume_at_round_boundary_equals_uninterrupted_run(small_digits, tmp_path):
    def strategy():
        return FedRCStrategy(3, clients_per_round=4, local_steps=2, seed=3)

    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=small_digits)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(
        strategy(), max_epochs=2, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint]
    )
    first.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=small_digits, ckpt_path=str(tmp_path / "last.ckpt"))

    a, b = straight.lightning_module, resumed.lightning_module
    assert resumed.current_epoch == straight.current_epoch == 4
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    for key, value in a.client_state.state_dict().items():
        assert torch.equal(value, b.client_state.state_dict()[key]), key


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


@pytest.mark.parametrize("name", ["fedsoft", "fedrc_adam", "cfl"])
def test_resume_is_exact_with_algorithm_state(digits, tmp_path, name):
    def strategy():
        return {
            "fedsoft": lambda: FedSoftStrategy(2, selection_size=3, local_steps=2, estimation_interval=3),
            "fedrc_adam": lambda: FedRCStrategy(3, clients_per_round=5, local_steps=2, adam_gamma=True),
            "cfl": lambda: CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6),
        }[name]()

    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=digits)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(
        strategy(), max_epochs=2, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint]
    )
    first.fit(MLPClassifier(lr=0.2), datamodule=digits)
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=digits, ckpt_path=str(tmp_path / "last.ckpt"))
    a, b = straight.lightning_module, resumed.lightning_module
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    state_a, state_b = a.client_state.state_dict(), b.client_state.state_dict()
    assert set(state_a) == set(state_b)
    for key, value in state_a.items():
        assert torch.equal(value, state_b[key]), key


@pytest.fixture
def console(monkeypatch):
    """What Lightning's console logger (``rank_zero_info``) prints, as a list of lines; and the
    SIGINT handler restored after the fit (Lightning ignores Ctrl-C while it shuts down)."""
    import logging
    import signal

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    from lightning_utilities.core import rank_zero

    logger = rank_zero.log  # rank_zero_info's logger (Lightning names it; tests/conftest.py quiets it)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    saved = signal.getsignal(signal.SIGINT)
    yield lines
    signal.signal(signal.SIGINT, saved)
    logger.removeHandler(handler)
    logger.setLevel(level)


class InterruptAt(pl.Callback):
    """Ctrl-C at the start of a round (a KeyboardInterrupt, as Python raises for SIGINT)."""

    def __init__(self, round_index: int) -> None:
        self.round_index = round_index

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.round_index:
            raise KeyboardInterrupt


def test_ctrl_c_says_how_to_resume_from_the_last_round_checkpoint(small_digits, tmp_path, console):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = make_trainer(FedRCStrategy(3, clients_per_round=4, local_steps=1), 5,
                           callbacks=[checkpoint, InterruptAt(2)], enable_checkpointing=True)  # fmt: skip
    with pytest.raises(SystemExit):
        trainer.fit(MLPClassifier(), datamodule=small_digits)
    last = str(tmp_path / "last.ckpt")
    assert (
        f"training stopped in round 3 of 5. To resume from the last round-boundary checkpoint, {last}: "
        f"fedcluster fit <the same arguments> --ckpt_path {last} (Python: trainer.fit(module, "
        f"datamodule=dm, ckpt_path='{last}'))" in "\n".join(console)
    )
    resumed = make_trainer(
        FedRCStrategy(3, clients_per_round=4, local_steps=1), 5, enable_checkpointing=False
    )
    resumed.fit(MLPClassifier(), datamodule=small_digits, ckpt_path=last)
    assert resumed.lightning_module.rounds_trained == 5


def test_ctrl_c_without_a_checkpoint_says_there_is_nothing_to_resume(small_digits, console):

    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=4, local_steps=1), 5, callbacks=[InterruptAt(1)]
    )
    with pytest.raises(SystemExit):
        trainer.fit(MLPClassifier(), datamodule=small_digits)
    assert "training stopped in round 2 of 5 (1 rounds done) and no checkpoint was saved" in "\n".join(
        console
    )
