"""engine/executors/loop.py: fine-tuning (``finetune_epochs``) changes local accuracy, not the models."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster import (
    FedRCStrategy,
)
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.executors import loop
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.weights import cluster_weights


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_finetuning_changes_local_accuracy_but_not_the_models(digits):
    results = {}
    for epochs in (0, 1):
        trainer = make_trainer(
            FedRCStrategy(
                3, clients_per_round=6, local_steps=2, finetune_epochs=epochs, shared_layers=("net.0",)
            ),
            max_epochs=2,
            limit_val_batches=0,
        )
        trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
        before = cluster_weights(trainer.lightning_module)
        results[epochs] = trainer.test(trainer.lightning_module, datamodule=digits, verbose=False)[0]
        after = cluster_weights(trainer.lightning_module)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert results[1]["test/local_acc"] != results[0]["test/local_acc"]
    assert results[1]["test/global_acc"] == results[0]["test/global_acc"]


def test_the_heap_is_released_before_every_client_turn(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(loop, "release_free_heap", lambda: calls.append(1) or False)
    generator = torch.Generator().manual_seed(0)
    splits = [
        (torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator))
        for n in (9, 14, 5, 11)
    ]
    dm = lf.FederatedDataModule(splits, [(x[:2], y[:2]) for x, y in splits], num_classes=3, batch_size=4)
    strategy = lf.FedRCStrategy(2, local_epochs=1, executor="loop", seed=0)
    make_trainer(strategy, max_epochs=2, limit_val_batches=0).fit(
        MLPClassifier(in_features=6, num_classes=3, hidden=(8,)), datamodule=dm
    )
    assert len(calls) == 2 * len(splits)  # one per client turn, not per local step


def test_seeding_a_clients_random_layers_on_a_cpu_draws_what_torch_manual_seed_draws(monkeypatch):
    """On a CPU the client's seed goes to the CPU generator alone: dropout masks and any other CPU
    draws equal those after ``torch.manual_seed``, and no accelerator generator is seeded (its
    lazy seeding records a stack trace per call); on another device every generator is seeded."""
    dropout = torch.nn.Dropout(0.5)
    torch.manual_seed(1234)
    expected = (dropout(torch.ones(64)), torch.rand(8))
    torch.manual_seed(99)  # another state, which the seeding must replace
    seeded_all: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded_all.append)
    loop.seed_random_layers(1234, torch.device("cpu"))
    assert torch.equal(dropout(torch.ones(64)), expected[0]) and torch.equal(torch.rand(8), expected[1])
    assert seeded_all == []
    loop.seed_random_layers(1234, torch.device("cuda"))
    assert seeded_all == [1234]
