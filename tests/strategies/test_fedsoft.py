"""strategies/fedsoft.py: FedSoft through the public API: personal models are kept and give the local
accuracy."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_fedcluster import (
    FedSoftStrategy,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_fedsoft_personal_models_are_kept_and_give_local_accuracy(digits):
    strategy = FedSoftStrategy(3, selection_size=2, local_steps=2)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    state = module.client_state
    assert set(state.personal) == set(state.seen.nonzero().flatten().tolist())
    assert all(v.device.type == "cpu" for v in state.personal.values())
    assert 2 <= len(state.personal) <= 12
    # Local accuracy is measured with the personal models: recompute it by hand.
    results = trainer.test(module, datamodule=digits, verbose=False)[0]
    correct = total = 0
    for client in range(digits.num_clients):
        x, y = digits.test_split(client)
        if client in state.personal:
            model = copy.deepcopy(module.models[0])
            torch.nn.utils.vector_to_parameters(state.personal[client].clone(), model.parameters())
            model.eval()
            with torch.no_grad():
                predicted = model(x).argmax(1)
        else:
            omega = state.omega[client]
            predicted = module.predict_proba(x, omega).argmax(1)
        correct += int((predicted == y).sum())
        total += len(y)
    assert results["test/local_acc"] == pytest.approx(correct / total, abs=1e-6)  # logged as float32
