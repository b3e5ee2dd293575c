"""The docs' one-file algorithm (docs/how-to/new-algorithm.md), with its own server action, runs
on Flower's in-process grid as on the Lightning engine, with no Flower code of its own."""

from __future__ import annotations

import torch

from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.models import MLPClassifier
from tests.docs.test_new_algorithm import _datamodule, _example, _fit, _strategy
from tests.flower.local_grid import partitions, run_local


def test_the_one_file_algorithm_runs_on_flowers_grid_as_on_lightning(task_identity):
    example = _example()
    apps = FlowerApps(
        lambda: _strategy(example, "loop"),
        MLPClassifier,
        _datamodule,
        num_rounds=3,
        collect_client_state=True,
    )
    flower, _ = run_local(apps, partitions(2))
    lightning = _fit(_strategy(example, "loop")).lightning_module
    assert int(flower.client_state.active.sum()) < 4  # the rule's own action ran on the Flower server
    assert torch.equal(flower.client_state.active, lightning.client_state.active)
    for k in range(4):
        for a, b in zip(flower.cluster_tensors(k), lightning.cluster_tensors(k), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
