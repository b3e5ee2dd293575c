"""DigitsFederated: the embedded default data set as a FedRC scenario."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules import DigitsFederated, FederatedDataModule
from lightning_fedcluster.datamodules.shifts import label_map
from tests.datamodules.test_scenario import assert_same


def test_digits_defaults() -> None:
    dm = DigitsFederated()
    assert dm.num_clients == 30 and dm.num_global_clients == 3 and dm.num_classes == 10
    assert dm.train_x.shape[1:] == (64,) and dm.train_x.dtype == torch.float32
    assert dm.train_x.min() >= 0 and dm.train_x.max() <= 1
    assert 44 < float((dm.train_sizes + dm.val_sizes + dm.test_sizes).float().mean()) < 52
    assert torch.bincount(dm.metadata.concept).tolist() == [15, 8, 7]
    assert sum(s != "clean" for s in dm.metadata.feature_style) == 6 + 2 + 1
    assert dm.metadata.global_concept.tolist() == [0, 1, 2]
    assert dm.hparams["num_clients"] == 30 and dm.hparams["concepts"] == 3
    _, y0 = dm.global_split(0)
    for g in (1, 2):
        xg, yg = dm.global_split(g)
        assert torch.equal(xg, dm.global_split(0)[0])
        assert torch.equal(yg, label_map(g, 10)[y0])


def test_digits_keyword_construction_matches_from_tensors(digits) -> None:
    config = {
        "num_clients": 8,
        "concepts": 2,
        "dirichlet_alpha": 0.5,
        "corrupt_fraction": 0.25,
        "seed": 5,
    }
    dm = DigitsFederated(**config, batch_size=16, as_images=True)
    x, y = digits
    # image_shape serves the flat rows as the 8x8 images DigitsFederated(as_images=True) serves
    ref = FederatedDataModule.from_tensors(x, y, image_shape=(1, 8, 8), num_classes=10, **config)
    assert ref.train_x.shape[1:] == (1, 8, 8)
    assert_same(dm, ref)
    assert dm.batch_size == 16 and dm.metadata.feature_style == ref.metadata.feature_style
    assert type(DigitsFederated.from_tensors(x, y, num_clients=3, corrupt_fraction=0)) is FederatedDataModule


def test_digits_validation_names_the_argument() -> None:
    with pytest.raises(ValueError, match="num_clients"):
        DigitsFederated(num_clients=0)
    with pytest.raises(ValueError, match="batch_size"):
        DigitsFederated(batch_size=0)
