"""The loop executor (and a Flower node, through the same ``start_turn``) gives the freed heap
back before every client's turn, so a round's RSS cannot grow with fragmentation (issue 17)."""

from __future__ import annotations

import torch

import lightning_fedcluster as lf
from lightning_fedcluster.engine.executors import loop
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


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
