"""strategies/fesem.py: FeSEM/WeCFL through the public API: centres from the first round's local models,
bad representation layers refused before training (with D-FedEM's graph density)."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster import (
    DFedEMStrategy,
    FeSEMStrategy,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_fesem_initialises_centres_from_the_first_rounds_local_models(digits):
    trainer = make_trainer(
        FeSEMStrategy(3, clients_per_round=6, local_steps=2), max_epochs=1, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    state = module.client_state
    assert float(state.extra["centres_ready"]) == 1.0
    assigned = state.omega[state.seen]
    assert torch.equal(assigned.sum(1), torch.ones(6, dtype=torch.float64)) and assigned.max() == 1.0
    # The three centres are three different local models trained from the same start.
    flat = [torch.cat([p.flatten() for p in m.parameters()]) for m in module.models]
    assert not torch.equal(flat[0], flat[1]) and not torch.equal(flat[1], flat[2])
    assert len(set(assigned.argmax(1).tolist())) >= 2


def test_bad_representation_layers_and_graph_density_fail_before_training(digits):
    trainer = make_trainer(FeSEMStrategy(3, representation_layers=("trunk",)), max_epochs=1)
    with pytest.raises(ValueError, match="representation_layers=\\('trunk',\\) matches no parameter"):
        trainer.fit(MLPClassifier(), datamodule=digits)
    assert trainer.global_step == 0
    with pytest.raises(ValueError, match="edge_probability"):
        DFedEMStrategy(3, edge_probability=1.5)
    with pytest.raises(ValueError, match="clients_per_round"):
        DFedEMStrategy(3, clients_per_round=4)


def test_centres_set_by_the_server_start_without_the_old_models_momentum(digits):
    """The first round's server step (FedAvgM) fills cluster 0's velocity; the K-means start then
    replaces every centre, so no velocity of the old models may survive into round 1."""
    strategy = FeSEMStrategy(3, clients_per_round=6, local_steps=2, server_optimizer="momentum")
    trainer = make_trainer(strategy, max_epochs=1, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    assert float(module.client_state.extra["centres_ready"]) == 1.0
    assert module.server_optimizer is not None
    left = [key for key in module.server_optimizer.state if key.startswith("cluster")]
    assert left == [], left
