"""The docs' one-file algorithms (docs/how-to/new-algorithm.md), one with its own server action and
the merge rule, run on Flower's in-process grid as on the Lightning engine, with no Flower code of
their own; a merge of node-held per-sample state is refused by name."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.models import MLPClassifier
from tests.docs.test_new_algorithm import _datamodule, _example, _fit, _merging, _strategy
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


MERGE_ROUNDS = 2  # 4 clusters -> 3 -> 2: the last merge leaves two, whose ω the nodes must get


def _merge_apps(example: dict, **options) -> FlowerApps:
    return FlowerApps(
        lambda: _merging(example, "loop", **options),
        MLPClassifier,
        _datamodule,
        num_rounds=MERGE_ROUNDS,
        collect_client_state=True,
        eval_every=1,
    )


def test_the_one_file_merge_rule_runs_on_flowers_grid_as_on_lightning(task_identity):
    """The server's merges reach the nodes (ω and label sums with the clients' next round, the
    removal with every message) and the run equals the Lightning engine's."""
    example = _example()
    apps = _merge_apps(example)
    flower, _ = run_local(apps, partitions(2))
    trainer = _fit(_merging(example, "loop"), rounds=MERGE_ROUNDS)
    lightning = trainer.lightning_module
    # The last round's merge reaches the nodes' validation pass too (ω of every node's client).
    validation = float(trainer.callback_metrics["val/local_acc"])
    assert apps.server.metrics[-1]["val/local_acc"] == pytest.approx(validation, abs=1e-6)
    assert int(flower.client_state.active.sum()) == 2
    assert torch.equal(flower.client_state.active, lightning.client_state.active)
    torch.testing.assert_close(flower.client_state.omega, lightning.client_state.omega, rtol=0, atol=1e-12)
    torch.testing.assert_close(flower.client_state.label_sums, lightning.client_state.label_sums)
    for k in range(4):
        for a, b in zip(flower.cluster_tensors(k), lightning.cluster_tensors(k), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_merge_of_node_held_per_sample_state_is_refused_by_name(task_identity):
    with pytest.raises(NotImplementedError, match="MergeClusters yet: it rewrites the clients' 'gamma'"):
        run_local(_merge_apps(_example(), adam_gamma=True), partitions(2))
