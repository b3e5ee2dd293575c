"""FederatedDataModule beyond the FedRC scenario: regression targets, clients from any partition,
unseen clients, a separate global test set, map-style datasets, mixture metadata."""

import re

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import ClientMetadata, FederatedDataModule, partition
from lightning_fedcluster.datamodules.digits import load_digits_tensors
from lightning_fedcluster.datamodules.federated import build_scenario, dataset_to_tensors


def reg(n: int, d: int | None = None, features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (n,) if d is None else (n, d)
    return torch.rand(n, features), torch.randn(shape)


def lab(n: int, label: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3), torch.full((n,), label, dtype=torch.long)


# --- regression ------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [None, 2])
def test_float_targets_make_a_regression_task(d: int | None) -> None:
    empty = (torch.empty(0, 3), torch.empty((0,) if d is None else (0, d)))
    dm = FederatedDataModule([reg(4, d), reg(3, d)], [reg(1, d), empty], [reg(5, d)])
    assert dm.task == "regression" and dm.num_classes is None
    assert dm.target_shape == (() if d is None else (d,))
    assert dm.output_size == (1 if d is None else d)
    assert dm.train_y.dtype == torch.float32 and dm.train_y.shape == ((7,) if d is None else (7, d))
    assert dm.test_y.shape[0] == 1 and dm.global_y.shape[0] == 5
    assert dm.metadata.concept.tolist() == [0, 0]
    no_global = FederatedDataModule([reg(4, d)], [reg(1, d)])
    assert no_global.global_y.dtype == torch.float32 and no_global.global_y.shape[1:] == dm.target_shape


def test_classification_reports_its_task() -> None:
    dm = FederatedDataModule([lab(3, 0), lab(2, 2)], [lab(1), lab(1)])
    assert dm.task == "classification" and dm.num_classes == 3 and dm.output_size == 3
    assert dm.target_shape == ()


REGRESSION_ERRORS = [
    ({"client_train": [reg(2)], "client_test": [lab(1)]}, TypeError,
     re.escape("client_test[0] targets must be floating point for a regression task")),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "num_classes": 3}, TypeError,
     re.escape("client_train[0] labels must be integer class indices")),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "task": "regression", "num_classes": 2},
     ValueError, "pass num_classes=None"),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "task": "ranking"}, ValueError,
     "task must be"),
    ({"client_train": [reg(2, 2)], "client_test": [reg(1, 3)]}, ValueError,
     re.escape("client_test[0] targets have per-sample shape (3,)")),
    ({"client_train": [(torch.rand(2, 3), torch.rand(2, 2, 2))], "client_test": [reg(1)]},
     ValueError, re.escape("regression targets must be [N] or [N, D]")),
    ({"client_train": [lab(2)], "client_test": [lab(1)], "task": "regression"}, TypeError,
     "use y.float"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), REGRESSION_ERRORS)
def test_regression_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    kwargs = dict(kwargs)
    args = (kwargs.pop("client_train"), kwargs.pop("client_test"))
    with pytest.raises(error, match=match):
        FederatedDataModule(*args, **kwargs)


# --- metadata mixture ------------------------------------------------------------------------


def test_metadata_mixture_is_checked() -> None:
    meta = ClientMetadata(torch.tensor([0, 1]), ["clean"] * 2, torch.tensor([0, 1]),
                          mixture=torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64))
    assert meta.mixture.dtype == torch.float32
    for bad in (torch.tensor([[0.5, 0.4], [0.3, 0.7]]), torch.tensor([0.5, 0.5]),
                torch.tensor([[1.2, -0.2], [0.3, 0.7]]), torch.tensor([[1, 0], [0, 1]])):
        with pytest.raises(ValueError, match="metadata.mixture must be"):
            ClientMetadata(torch.tensor([0, 1]), ["clean"] * 2, torch.tensor([0]), mixture=bad)


# --- clients from any partition --------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return load_digits_tensors()


def test_from_partition_with_unseen_clients(digits) -> None:
    x, y = digits
    parts = partition.n_class_split(y.numpy(), 20, 2, np.random.default_rng(0))
    concept = np.arange(20) % 2
    dm = FederatedDataModule.from_partition(x, y, parts, concept=concept, unseen_fraction=0.2,
                                            test_fraction=0.25, seed=3, batch_size=8)
    assert dm.num_clients == 16 and dm.num_global_clients == 4 and dm.batch_size == 8
    seen, unseen = partition.holdout_clients(20, 0.2, np.random.default_rng(
        np.random.SeedSequence(3).spawn(2)[0]))
    assert dm.metadata.concept.tolist() == concept[seen].tolist()
    assert dm.metadata.global_concept.tolist() == concept[unseen].tolist()
    for g, i in enumerate(unseen):  # an unseen client keeps all its rows
        gx, gy = dm.global_split(g)
        assert torch.equal(gx, x[parts[i]]) and torch.equal(gy, y[parts[i]])
    for j, i in enumerate(seen):
        (tx, ty), (sx, sy) = dm.train_split(j), dm.test_split(j)
        assert tx.shape[0] + sx.shape[0] == parts[i].size
        assert sx.shape[0] == partition.held_out_count(parts[i].size, 0.25)
        assert set(torch.cat([ty, sy]).tolist()) == set(y[parts[i]].tolist())
    again = FederatedDataModule.from_partition(x, y, parts, concept=concept, unseen_fraction=0.2,
                                               test_fraction=0.25, seed=3)
    assert torch.equal(again.train_x, dm.train_x) and torch.equal(again.global_y, dm.global_y)


def test_from_partition_regression_with_natural_ids() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0])
    ids = np.repeat(["a", "b", "c"], [10, 20, 30])
    mixture = np.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.8]])
    dm = FederatedDataModule.from_partition(x, y, partition.natural_split(ids), mixture=mixture,
                                            concept=[0, 0, 1])
    assert dm.task == "regression" and dm.num_clients == 3
    assert (dm.train_sizes + dm.test_sizes).tolist() == [10, 20, 30]
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


# --- separate global test set ----------------------------------------------------------------


def test_global_test_from_a_separate_set(digits) -> None:
    x, y = digits
    train_x, train_y, test_x, test_y = x[:1400], y[:1400], x[1400:], y[1400:]
    args = build_scenario(train_x, train_y, num_clients=10, concepts=3, image_shape=(1, 8, 8),
                          global_test=(test_x, test_y), seed=0)
    assert sum(tx.shape[0] + sx.shape[0] for (tx, _), (sx, _) in
               zip(args["client_train"], args["client_test"], strict=True)) == 1400
    assert len(args["global_test"]) == 3
    for c, (gx, gy) in enumerate(args["global_test"]):
        assert torch.equal(gx, test_x)  # clean inputs, the concept's label map
        assert torch.equal(gy, {0: test_y, 1: 9 - test_y, 2: (test_y + 1) % 10}[c])
    with pytest.raises(ValueError, match="global_test_fraction=0.2 was given together with global_test"):
        build_scenario(train_x, train_y, num_clients=10, global_test=(test_x, test_y),
                       global_test_fraction=0.2, corrupt_fraction=0)
    with pytest.raises(ValueError, match="global_test inputs have per-sample shape"):
        build_scenario(train_x, train_y, num_clients=10, global_test=(test_x[:, :10], test_y),
                       corrupt_fraction=0)
