"""Clients from any partition (`build_clients`, through `from_partition`): unseen clients,
regression with natural ids, argument checks; map-style datasets as tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import FederatedDataModule, partition
from lightning_fedcluster.datamodules.federated import dataset_to_tensors


def test_from_partition_with_unseen_clients(digits) -> None:
    x, y = digits
    parts = partition.n_class_split(y.numpy(), 20, 2, np.random.default_rng(0))
    concept = np.arange(20) % 2
    dm = FederatedDataModule.from_partition(
        x, y, parts, concept=concept, unseen_fraction=0.2, test_fraction=0.25, seed=3, batch_size=8
    )
    assert dm.num_clients == 16 and dm.num_global_clients == 4 and dm.batch_size == 8
    seen, unseen = partition.holdout_clients(
        20, 0.2, np.random.default_rng(np.random.SeedSequence(3).spawn(2)[0])
    )
    assert dm.metadata.concept.tolist() == concept[seen].tolist()
    assert dm.metadata.global_concept.tolist() == concept[unseen].tolist()
    for g, i in enumerate(unseen):  # an unseen client keeps all its rows
        gx, gy = dm.global_split(g)
        assert torch.equal(gx, x[parts[i]]) and torch.equal(gy, y[parts[i]])
    for j, i in enumerate(seen):
        (tx, ty), (vx, vy), (sx, sy) = dm.train_split(j), dm.val_split(j), dm.test_split(j)
        assert tx.shape[0] + vx.shape[0] + sx.shape[0] == parts[i].size
        assert vx.shape[0] + sx.shape[0] == partition.held_out_count(parts[i].size, 0.25)
        assert set(torch.cat([ty, vy, sy]).tolist()) == set(y[parts[i]].tolist())
    again = FederatedDataModule.from_partition(
        x, y, parts, concept=concept, unseen_fraction=0.2, test_fraction=0.25, seed=3
    )
    assert torch.equal(again.train_x, dm.train_x) and torch.equal(again.global_y, dm.global_y)


def test_from_partition_regression_with_natural_ids() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0])
    ids = np.repeat(["a", "b", "c"], [10, 20, 30])
    mixture = np.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.8]])
    dm = FederatedDataModule.from_partition(
        x, y, partition.natural_split(ids), mixture=mixture, concept=[0, 0, 1]
    )
    assert dm.task == "regression" and dm.num_clients == 3
    assert (dm.train_sizes + dm.val_sizes + dm.test_sizes).tolist() == [10, 20, 30]
    assert torch.allclose(dm.metadata.mixture, torch.tensor(mixture, dtype=torch.float32))


def test_from_partition_validation(digits) -> None:
    x, y = digits
    with pytest.raises(ValueError, match=r"parts\[1\] is empty"):
        FederatedDataModule.from_partition(x, y, [np.arange(5), np.array([], dtype=int)])
    with pytest.raises(ValueError, match=r"parts\[0\] must hold integer row indices"):
        FederatedDataModule.from_partition(x, y, [np.array([0, 5000])])
    with pytest.raises(ValueError, match="concept has 1 entries but there are 2 parts"):
        FederatedDataModule.from_partition(x, y, [np.arange(5), np.arange(5, 9)], concept=[0])
    with pytest.raises(ValueError, match="unseen_fraction must be a number in"):
        FederatedDataModule.from_partition(x, y, [np.arange(5)], unseen_fraction=1.5)


def test_dataset_to_tensors_reads_map_style_datasets() -> None:
    data = torch.utils.data.TensorDataset(torch.rand(5, 2, 2), torch.tensor([0, 1, 1, 0, 2]))
    x, y = dataset_to_tensors(data)
    assert x.shape == (5, 2, 2) and y.tolist() == [0, 1, 1, 0, 2] and y.dtype == torch.long
    x2, y2 = dataset_to_tensors(data, indices=[4, 0])
    assert y2.tolist() == [2, 0] and torch.equal(x2[0], data[4][0])
    with pytest.raises(TypeError, match="map-style dataset"):
        dataset_to_tensors(iter([1, 2]))
