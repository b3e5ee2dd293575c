"""engine/copies.py: the K cluster copies start different and leave the user's module untouched;
shared layers are one module trained by all clusters."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster import (
    ClusteredModule,
    FedRCStrategy,
)
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_cluster_copies_start_different_and_user_module_is_untouched():
    user = MLPClassifier()
    before = {k: v.clone() for k, v in user.state_dict().items()}
    module = ClusteredModule(user, num_clusters=3, seed=0)
    first = [p for p in module.models[0].parameters()][0]
    second = [p for p in module.models[1].parameters()][0]
    assert not torch.equal(first, second)
    assert all(torch.equal(before[k], v) for k, v in user.state_dict().items())
    again = ClusteredModule(MLPClassifier(), num_clusters=3, seed=0)
    assert torch.equal(first, [p for p in again.models[0].parameters()][0])


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_shared_feature_extractor_is_one_module_trained_by_all_clusters(digits):
    strategy = FedRCStrategy(3, clients_per_round=6, local_steps=2, shared_layers=("net.0",))
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    model = MLPClassifier(lr=0.2)
    trainer.fit(model, datamodule=digits)
    module = trainer.lightning_module
    assert module.models[1].net[0] is module.models[0].net[0] is module.models[2].net[0]
    params = [p for group in trainer.optimizers[0].param_groups for p in group["params"]]
    assert len(params) == len({id(p) for p in params}) == 2 + 3 * 2
    assert not torch.equal(module.models[0].net[2].weight, module.models[1].net[2].weight)
    fresh = ClusteredModule(MLPClassifier(lr=0.2), 3, seed=0, shared_layers=("net.0",))
    assert not torch.equal(fresh.models[0].net[0].weight, module.models[0].net[0].weight)
    with pytest.raises(ValueError, match="shared_layers names 'trunk'"):
        ClusteredModule(MLPClassifier(), 3, shared_layers=("trunk",))


def test_attached_trainer_is_the_modules_trainer_or_none_through_lightnings_public_property():
    import lightning.pytorch as pl
    from torch import nn

    from lightning_fedcluster.engine.copies import attached_trainer

    module = pl.LightningModule()
    assert attached_trainer(module) is None  # not attached: Lightning's property raises, this says None
    assert attached_trainer(nn.Linear(2, 2)) is None
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    module.trainer = trainer
    assert attached_trainer(module) is trainer
