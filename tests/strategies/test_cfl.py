"""strategies/cfl.py: CFL through the public API: a split creates a cluster from a copy of its parent."""

from __future__ import annotations

import torch

from lightning_fedcluster import (
    CFLStrategy,
    ClusteredModule,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_cfl_split_creates_a_cluster_from_a_copy_of_its_parent(digits):
    module = ClusteredModule(MLPClassifier(lr=0.2), 3, seed=0)
    strategy = CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6)  # always split while there is room
    trainer = make_trainer(strategy, max_epochs=1, limit_val_batches=0)
    trainer.fit(module, datamodule=digits)
    state = module.client_state
    assert state.active.tolist() == [True, True, False]
    assert set(state.omega.argmax(1).tolist()) == {0, 1}
    for a, b in zip(module.models[0].parameters(), module.models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    trainer = make_trainer(
        CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6), max_epochs=3, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    assert trainer.lightning_module.client_state.active.tolist() == [True, True, True]
