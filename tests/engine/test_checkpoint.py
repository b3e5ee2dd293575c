"""engine/checkpoint.py: resuming from a round checkpoint equals the uninterrupted run, including
algorithm-specific client state."""

from __future__ import annotations

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
    first = make_trainer(strategy(), max_epochs=2, limit_val_batches=0, enable_checkpointing=True,
                         callbacks=[checkpoint])
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
