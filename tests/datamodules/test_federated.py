"""FederatedDataModule: concatenated storage and views, dtypes, metadata, constructor checks, and
regression targets."""

import dataclasses
import re

import lightning.pytorch as pl
import pytest
import torch

from lightning_fedcluster.datamodules import ClientMetadata, FederatedDataModule
from lightning_fedcluster.engine.task import Task


def pair(n: int, label: int = 0, features: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, features), torch.full((n,), label, dtype=torch.long)


def test_concatenated_storage_and_views() -> None:
    train = [pair(3, 0), pair(5, 1), pair(2, 2)]
    test = [pair(1, 1), (torch.empty(0, 4), torch.empty(0, dtype=torch.long)), pair(2, 0)]
    held = [pair(4, 2), pair(4, 1)]
    dm = FederatedDataModule(train, test, held, batch_size=8)
    assert isinstance(dm, pl.LightningDataModule)
    assert dm.num_clients == 3 and dm.num_global_clients == 2
    assert dm.num_classes == 3 and dm.batch_size == 8
    assert dm.train_offsets.tolist() == [0, 3, 8, 10]
    # held-out rows [1, 0, 2]: floor(val_share * n) to validation, the rest to test
    assert dm.val_offsets.tolist() == [0, 0, 0, 1] and dm.test_offsets.tolist() == [0, 1, 1, 2]
    assert dm.global_offsets.tolist() == [0, 4, 8]
    assert dm.train_sizes.tolist() == [3, 5, 2] and dm.test_sizes.tolist() == [1, 0, 1]
    assert dm.train_sizes.dtype == torch.long and dm.train_offsets.dtype == torch.long
    assert dm.train_x.shape == (10, 4) and dm.train_x.dtype == torch.float32
    for i, (x, y) in enumerate(train):
        got_x, got_y = dm.train_split(i)
        assert torch.equal(got_x, x) and torch.equal(got_y, y)
        assert got_x.untyped_storage().data_ptr() == dm.train_x.untyped_storage().data_ptr()
    assert dm.test_split(1)[0].shape == (0, 4)
    assert torch.equal(dm.global_split(1)[1], held[1][1])
    with pytest.raises(IndexError, match="i must be"):
        dm.train_split(3)


def test_dtypes_are_normalised_and_images_kept() -> None:
    x = torch.rand(6, 1, 28, 28, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32)
    dm = FederatedDataModule([(x[:4], y[:4]), (x[4:], y[4:])], [(x[:1], y[:1]), (x[:0], y[:0])])
    assert dm.train_x.dtype == torch.float32 and dm.train_y.dtype == torch.long
    assert dm.train_x.shape == (6, 1, 28, 28)
    assert dm.num_global_clients == 0 and dm.global_x.shape == (0, 1, 28, 28)
    assert dm.num_classes == 6


def test_empty_test_split_may_be_given_as_flat_empty_tensor() -> None:
    empty = (torch.empty(0), torch.empty(0, dtype=torch.long))
    dm = FederatedDataModule([pair(3, 1)], [empty])
    assert dm.test_x.shape == (0, 4)


def test_default_and_custom_metadata() -> None:
    dm = FederatedDataModule([pair(2, 1), pair(2, 0)], [pair(1), pair(1)], [pair(2, 1)])
    assert dm.metadata.concept.tolist() == [0, 0]
    assert dm.metadata.feature_style == ["clean", "clean"]
    assert dm.metadata.global_concept.tolist() == [0]
    meta = ClientMetadata(torch.tensor([0, 2]), ["clean", "rotate:3"], torch.tensor([1]))
    dm = FederatedDataModule([pair(2, 1), pair(2, 0)], [pair(1), pair(1)], [pair(2, 1)], metadata=meta)
    assert dm.metadata is meta
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.concept = torch.tensor([1, 1])  # type: ignore[misc]


VALIDATION_CASES = [
    ({"client_train": [], "client_test": []}, ValueError, "client_train is empty"),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1), pair(1)]},
        ValueError,
        "client_test has 2 clients but client_train has 1",
    ),
    (
        {
            "client_train": [pair(2, 1)] * 3 + [pair(0)],
            "client_test": [pair(1)] * 4,
        },
        ValueError,
        re.escape(
            "client_train[3] is empty: every client needs at least one training sample; "
            "drop it or repartition"
        ),
    ),
    (
        {
            "client_train": [(torch.rand(3, 4), torch.zeros(2, dtype=torch.long))],
            "client_test": [pair(1)],
        },
        ValueError,
        re.escape("client_train[0] has 3 inputs but 2 labels"),
    ),
    (
        {"client_train": [pair(2, 1), pair(2, 0, features=5)], "client_test": [pair(1)] * 2},
        ValueError,
        re.escape("client_train[1] inputs have per-sample shape (5,)"),
    ),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1, 7)], "num_classes": 3},
        ValueError,
        re.escape("client_test[0] has label 7 outside [0, num_classes=3)"),
    ),
    (
        {"client_train": [pair(2, 1), pair(2, -1)], "client_test": [pair(1)] * 2},
        ValueError,
        re.escape("client_train[1] has label -1 outside [0, num_classes="),
    ),
    (
        {
            "client_train": [pair(2, 1)],
            "client_test": [pair(1)],
            "global_test": [pair(2, 5)],
            "num_classes": 4,
        },
        ValueError,
        re.escape("global_test[0] has label 5"),
    ),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1)], "batch_size": 0},
        ValueError,
        "batch_size",
    ),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1)], "num_classes": 1},
        ValueError,
        "num_classes",
    ),
    (
        {"client_train": [pair(2, 0)], "client_test": [pair(1)]},
        ValueError,
        "num_classes was inferred as 1",
    ),
    (
        {
            "client_train": [pair(2, 1)],
            "client_test": [pair(1)],
            "metadata": ClientMetadata.default(2),
        },
        ValueError,
        "metadata.concept has 2 entries",
    ),
    (
        {"client_train": [(torch.rand(2, 4), torch.rand(2))], "client_test": [pair(1)]},
        TypeError,
        "labels",
    ),
    (
        {
            "client_train": [(torch.ones(2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.long))],
            "client_test": [pair(1)],
        },
        TypeError,
        r"client_train\[0\] inputs must be floating point",
    ),
    (
        {"client_train": pair(2, 1), "client_test": [pair(1)]},
        TypeError,
        r"client_train\[0\] must be an \(x, y\) pair",
    ),
    (
        {"client_train": [torch.rand(2, 4)], "client_test": [pair(1)]},
        TypeError,
        r"client_train\[0\]",
    ),
    (
        {"client_train": torch.rand(2, 4), "client_test": [pair(1)]},
        TypeError,
        "client_train must be a sequence",
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), VALIDATION_CASES)
def test_constructor_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    kwargs = dict(kwargs)
    args = (kwargs.pop("client_train"), kwargs.pop("client_test"))
    with pytest.raises(error, match=match):
        FederatedDataModule(*args, **kwargs)


def reg(n: int, d: int | None = None, features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (n,) if d is None else (n, d)
    return torch.rand(n, features), torch.randn(shape)


def lab(n: int, label: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3), torch.full((n,), label, dtype=torch.long)


@pytest.mark.parametrize("d", [None, 2])
def test_float_targets_make_a_regression_task(d: int | None) -> None:
    empty = (torch.empty(0, 3), torch.empty((0,) if d is None else (0, d)))
    dm = FederatedDataModule([reg(4, d), reg(3, d)], [reg(1, d), empty], [reg(5, d)])
    assert dm.task is Task.REGRESSION and dm.task == "regression" and dm.num_classes is None
    assert dm.target_shape == (() if d is None else (d,))
    assert dm.output_size == (1 if d is None else d)
    assert dm.train_y.dtype == torch.float32 and dm.train_y.shape == ((7,) if d is None else (7, d))
    assert dm.test_y.shape[0] == 1 and dm.global_y.shape[0] == 5
    assert dm.metadata.concept.tolist() == [0, 0]
    no_global = FederatedDataModule([reg(4, d)], [reg(1, d)])
    assert no_global.global_y.dtype == torch.float32 and no_global.global_y.shape[1:] == dm.target_shape


def test_classification_reports_its_task() -> None:
    dm = FederatedDataModule([lab(3, 0), lab(2, 2)], [lab(1), lab(1)])
    assert dm.task is Task.CLASSIFICATION and dm.num_classes == 3 and dm.output_size == 3
    assert dm.target_shape == ()


REGRESSION_ERRORS = [
    (
        {"client_train": [reg(2)], "client_test": [lab(1)]},
        TypeError,
        re.escape("client_test[0] targets must be floating point for a regression task"),
    ),
    (
        {"client_train": [reg(2)], "client_test": [reg(1)], "num_classes": 3},
        TypeError,
        re.escape("client_train[0] labels must be integer class indices"),
    ),
    (
        {"client_train": [reg(2)], "client_test": [reg(1)], "task": "regression", "num_classes": 2},
        ValueError,
        "pass num_classes=None",
    ),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "task": "ranking"}, ValueError, "task must be"),
    (
        {"client_train": [reg(2, 2)], "client_test": [reg(1, 3)]},
        ValueError,
        re.escape("client_test[0] targets have per-sample shape (3,)"),
    ),
    (
        {"client_train": [(torch.rand(2, 3), torch.rand(2, 2, 2))], "client_test": [reg(1)]},
        ValueError,
        re.escape("regression targets must be [N] or [N, D]"),
    ),
    ({"client_train": [lab(2)], "client_test": [lab(1)], "task": "regression"}, TypeError, "use y.float"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), REGRESSION_ERRORS)
def test_regression_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    kwargs = dict(kwargs)
    args = (kwargs.pop("client_train"), kwargs.pop("client_test"))
    with pytest.raises(error, match=match):
        FederatedDataModule(*args, **kwargs)
