"""strategies/ifca.py: IFCA through the public API: a cluster without members keeps its model."""

from __future__ import annotations

import copy

import torch

from lightning_fedcluster import (
    ClusteredModule,
    IFCAStrategy,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_ifca_cluster_without_members_keeps_its_model(digits):
    module = ClusteredModule(MLPClassifier(lr=0.2), 3, seed=0)
    with torch.no_grad():  # clusters 1 and 2 predict class 0 with certainty: nobody picks them
        for k in (1, 2):
            module.models[k].net[-1].bias.copy_(torch.tensor([1e3] + [0.0] * 9))
    frozen = [copy.deepcopy(module.models[k].state_dict()) for k in (1, 2)]
    trainer = make_trainer(
        IFCAStrategy(3, clients_per_round=6, local_steps=2), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(module, datamodule=digits)
    seen = module.client_state.seen
    assert torch.equal(
        module.client_state.omega[seen].argmax(1), torch.zeros(int(seen.sum()), dtype=torch.long)
    )
    for k, state in zip((1, 2), frozen, strict=True):
        for key, value in module.models[k].state_dict().items():
            assert torch.equal(value, state[key]), (k, key)
