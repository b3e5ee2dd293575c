"""strategies/dfedem.py: D-FedEM through the public API: clients keep their own models, and a complete
graph reaches consensus."""

from __future__ import annotations

import torch

from lightning_fedcluster import (
    DFedEMStrategy,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_dfedem_clients_keep_their_own_models_and_a_complete_graph_reaches_consensus(digits):
    trainer = make_trainer(
        DFedEMStrategy(3, local_steps=2, edge_probability=1.0), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    state = trainer.lightning_module.client_state
    assert sorted(state.personal) == list(range(12))
    size = sum(p.numel() for p in trainer.lightning_module.models.parameters())
    assert state.personal[0].numel() == size  # all K models of the client
    for vector in state.personal.values():  # complete graph: W = 1/M everywhere
        torch.testing.assert_close(vector, state.personal[0], rtol=0, atol=1e-6)
    sparse = make_trainer(
        DFedEMStrategy(3, local_steps=2, edge_probability=0.0), max_epochs=2, limit_val_batches=0
    )
    sparse.fit(MLPClassifier(lr=0.2), datamodule=digits)
    ring = sparse.lightning_module.client_state.personal
    assert not torch.allclose(ring[0], ring[6])  # a ring mixes only neighbours: no consensus yet
