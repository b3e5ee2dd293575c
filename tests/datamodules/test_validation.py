"""NaN/Inf in any split fails before training, naming the split, the client and the row count."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from lightning_fedcluster import FedAvgStrategy, FederatedDataModule
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

FIX = "clean or drop the rows before building the datamodule"
SPLITS = ("client_train", "client_test", "global_test")


def labelled(n: int, seed: int, features: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, features, generator=g), torch.randint(0, 3, (n,), generator=g)


def splits(regression: bool = False) -> dict[str, list]:
    """4 clients (8 train, 5 test rows each) and 2 global test clients (6 rows each)."""

    def pair(n, seed):
        x, y = labelled(n, seed)
        return (x, torch.randn(n)) if regression else (x, y)

    return {
        "client_train": [pair(8, i) for i in range(4)],
        "client_test": [pair(5, 10 + i) for i in range(4)],
        "global_test": [pair(6, 20 + g) for g in range(2)],
    }


def build(data: dict[str, list], regression: bool = False) -> FederatedDataModule:
    return FederatedDataModule(**data, num_classes=None if regression else 3)


def message(split: str, client: int, bad: int, rows: int, where: str = "inputs x", first: int = 1) -> str:
    return re.escape(
        f"{split}[{client}] has {bad} of {rows} rows with NaN or Inf in its {where} (first at row {first})"
    )


@pytest.mark.parametrize("split", SPLITS)
def test_nan_and_inf_name_the_split_and_client(split: str) -> None:
    data = splits()
    client = 1 if split == "global_test" else 2
    x, y = data[split][client]
    x = x.clone()
    x[1, 0] = float("nan")
    x[3, 2] = float("inf")
    data[split][client] = (x, y)
    with pytest.raises(ValueError, match=message(split, client, 2, x.shape[0])) as info:
        build(data)
    assert str(info.value).endswith(FIX)


@pytest.mark.parametrize("split", SPLITS)
def test_negative_inf_alone_is_caught(split: str) -> None:
    data = splits()
    x, y = data[split][0]
    x = x.clone()
    x[4, 1] = float("-inf")
    data[split][0] = (x, y)
    with pytest.raises(ValueError, match=message(split, 0, 1, x.shape[0], first=4)):
        build(data)


def test_regression_target_nan_is_caught() -> None:
    data = splits(regression=True)
    x, y = data["client_test"][3]
    y = y.clone()
    y[2] = float("nan")
    data["client_test"][3] = (x, y)
    with pytest.raises(ValueError, match=message("client_test", 3, 1, 5, "targets y", first=2)):
        build(data, regression=True)


def test_vector_regression_targets_and_inputs_together() -> None:
    data = splits(regression=True)
    data = {name: [(x, torch.randn(x.shape[0], 2)) for x, _ in pairs] for name, pairs in data.items()}
    x, y = data["global_test"][1]
    x, y = x.clone(), y.clone()
    x[0, 0] = float("nan")
    y[5, 1] = float("inf")
    data["global_test"][1] = (x, y)
    with pytest.raises(ValueError, match=message("global_test", 1, 2, 6, "inputs x and targets y", 0)):
        build(data, regression=True)


def test_several_clients_report_the_first_and_the_total() -> None:
    data = splits()
    for client, rows in ((1, [0, 7]), (3, [2])):
        x, y = data["client_train"][client]
        x = x.clone()
        x[rows, 0] = float("nan")
        data["client_train"][client] = (x, y)
    with pytest.raises(ValueError, match=message("client_train", 1, 2, 8, first=0)) as info:
        build(data)
    assert "(3 such rows across 2 clients of client_train)" in str(info.value)


def test_clean_datamodules_pass() -> None:
    dm = build(splits())
    dm.check_finite()
    dm.setup("fit")
    regression = build(splits(regression=True), regression=True)
    assert regression.task == "regression"
    regression.check_finite()
    DigitsFederated(num_clients=4, seed=0).check_finite()


def test_from_partition_names_the_partitioned_client() -> None:
    x, y = labelled(30, 0)
    x[12, 3] = float("nan")  # row 12 belongs to part 1
    parts = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    with pytest.raises(ValueError, match=message("client_train", 1, 1, 10, first=2)):
        FederatedDataModule.from_partition(x, y, parts, test_fraction=0.0, num_classes=3)
    clean_x, clean_y = labelled(30, 0)
    held_x, held_y = labelled(7, 1)
    held_x[6, 0] = float("inf")
    with pytest.raises(ValueError, match=message("global_test", 0, 1, 7, first=6)):
        FederatedDataModule.from_partition(
            clean_x, clean_y, parts, test_fraction=0.0, global_test=[(held_x, held_y)], num_classes=3
        )


def test_from_tensors_is_checked_too() -> None:
    x, y = labelled(80, 0)
    x[5, 0] = float("nan")
    with pytest.raises(ValueError, match=r"client_(train|test)\[\d+\] has 1 of \d+ rows with NaN or Inf"):
        FederatedDataModule.from_tensors(x, y, num_clients=4, corrupt_fraction=0.0, global_test_fraction=0.0)
    x, y = labelled(80, 0)
    test_x, test_y = labelled(10, 1)
    test_x[9, 1] = float("nan")
    with pytest.raises(ValueError, match=message("global_test", 0, 1, 10, first=9)):
        FederatedDataModule.from_tensors(
            x, y, num_clients=4, corrupt_fraction=0.0, global_test=(test_x, test_y)
        )


class TrainingCounter(MLPClassifier):
    """Counts forward calls in train mode, to prove no local step ran."""

    steps = 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            TrainingCounter.steps += 1
        return super().forward(x)


def test_tensors_poisoned_after_construction_fail_before_training() -> None:
    dm = build(splits())
    start = int(dm.train_offsets[3])
    dm.train_x[start + 1, 0] = float("nan")  # e.g. an in-place normalisation gone wrong
    TrainingCounter.steps = 0
    trainer = make_trainer(FedAvgStrategy(local_steps=2), max_epochs=2)
    with pytest.raises(ValueError, match=message("client_train", 3, 1, 8)):
        trainer.fit(TrainingCounter(in_features=4, num_classes=3), datamodule=dm)
    assert trainer.global_step == 0
    assert TrainingCounter.steps == 0


def _digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors

    return load_digits_tensors()


@pytest.mark.parametrize("image_shape", [(1, 8, 8), None])
def test_channels_last_images_are_refused_naming_the_permutation(image_shape) -> None:
    """[N, 8, 8, 1] has the 64 values per sample of image_shape=(1, 8, 8) and was accepted, to
    fail later inside the model's conv2d."""
    x, y = _digits_tensors()
    channels_last = x.reshape(-1, 1, 8, 8).permute(0, 2, 3, 1).contiguous()
    advice = r"look channels-last \[N, H, W, C\]; permute them to \[N, C, H, W\] with x.permute\(0, 3, 1, 2\)"
    with pytest.raises(ValueError, match=advice + r" \(shape \[N, 1, 8, 8\]\)"):
        FederatedDataModule.from_tensors(channels_last, y, num_clients=4, image_shape=image_shape)
    dm = FederatedDataModule.from_tensors(x.reshape(-1, 1, 8, 8), y, num_clients=4, image_shape=image_shape)
    assert tuple(dm.train_x.shape[1:]) == (1, 8, 8)  # channels-first passes


def test_labels_that_start_at_one_are_named_with_the_remap() -> None:
    """Labels 1..10 infer num_classes=11; a 10-logit model then read "set the model's output size
    to 11", where the fix is to remap the labels to 0..9."""
    x, y = _digits_tensors()
    dm = FederatedDataModule.from_tensors(x, y + 1, num_clients=4, corrupt_fraction=0.0)
    assert dm.num_classes == 11
    trainer = make_trainer(FedAvgStrategy(local_steps=1), max_epochs=1)
    with pytest.raises(ValueError, match=r"returns 10 logits .* num_classes=11: its labels run from 1 to 10 "
                                         r"\(no label below 1\), and labels must be class indices 0..C-1\. "
                                         r"Remap them .* y - 1"):  # fmt: skip
        trainer.fit(MLPClassifier(), datamodule=dm)
