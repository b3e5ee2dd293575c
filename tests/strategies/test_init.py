"""strategies/__init__.py: every registered strategy trains through the public API, and each one's
arguments are checked."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedcluster import (
    CFLStrategy,
    ClusteredModule,
    DFedEMStrategy,
    FedAvgStrategy,
    FedEMStrategy,
    FedProxStrategy,
    FedRCStrategy,
    FedSoftStrategy,
    FeSEMStrategy,
    IFCAStrategy,
    WeCFLStrategy,
)
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.weights import cluster_weights

STRATEGIES = {
    "fedrc": lambda: FedRCStrategy(3, clients_per_round=6, local_steps=3),
    "fedem": lambda: FedEMStrategy(3, clients_per_round=6, local_steps=3),
    "dfedem": lambda: DFedEMStrategy(3, local_steps=3),
    "ifca": lambda: IFCAStrategy(3, clients_per_round=6, local_steps=3),
    "fesem": lambda: FeSEMStrategy(3, clients_per_round=6, local_steps=3),
    "wecfl": lambda: WeCFLStrategy(3, clients_per_round=6, local_steps=3),
    "fedsoft": lambda: FedSoftStrategy(3, selection_size=2, local_steps=3),
    "cfl": lambda: CFLStrategy(3, local_steps=3),
    "fedavg": lambda: FedAvgStrategy(clients_per_round=6, local_steps=3),
    "fedprox": lambda: FedProxStrategy(mu=0.1, clients_per_round=6, local_steps=3),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_trains_through_the_public_api(digits, name):
    module = ClusteredModule(MLPClassifier(lr=0.2), STRATEGIES[name]().num_clusters, seed=0)
    before = cluster_weights(module)
    trainer = make_trainer(STRATEGIES[name](), max_epochs=3, limit_val_batches=0)
    trainer.fit(module, datamodule=digits)
    results = trainer.test(module, datamodule=digits, verbose=False)[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, cluster_weights(module), strict=True))
    assert 0.0 <= results["test/local_acc"] <= 1.0 and 0.0 <= results["test/global_acc"] <= 1.0
    assert -1.0 <= results["test/concept_ari"] <= 1.0
    state = module.client_state
    assert int(state.seen.sum()) >= 6
    assert torch.allclose(
        state.omega[state.seen].sum(1), torch.ones(int(state.seen.sum()), dtype=torch.float64)
    )
    assert module.round_metrics["train/loss"] > 0 and math.isfinite(module.round_metrics["train/loss"])


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="selection_size"):
        FedSoftStrategy(2, selection_size=0)
    with pytest.raises(ValueError, match="clients_per_round"):
        FedSoftStrategy(2, clients_per_round=5)
    with pytest.raises(ValueError, match="removal_threshold"):
        FedRCStrategy(3, config=FedRC.Config(removal_threshold=1.5))
    with pytest.raises(ValueError, match="label_noise_std"):
        FedRCStrategy(3, config=FedRC.Config(label_noise_std=-1.0))
    with pytest.raises(ValueError, match="label_noise_std"):
        FedEMStrategy(3, config=FedRC.Config(label_noise_std=1.0))
    with pytest.raises(ValueError, match="eps1"):
        CFLStrategy(3, eps1=0.0)
    with pytest.raises(ValueError, match="finetune_epochs"):
        FedRCStrategy(3, finetune_epochs=-1)
