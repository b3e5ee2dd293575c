"""models.py: the reference models: regressors and classifiers with the authors' solver settings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fedcluster.models import LinearRegressor, MLPClassifier, MLPRegressor


def test_linear_regressor_is_fedsofts_model() -> None:
    model = LinearRegressor(10, 1)
    assert model(torch.rand(4, 10)).shape == (4, 1)
    assert model.linear.bias is None  # no intercept
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.defaults["lr"] == 5e-3
    sgd = LinearRegressor(3, 2, bias=True, optimizer="sgd", lr=0.1).configure_optimizers()
    assert isinstance(sgd, torch.optim.SGD)


def test_mlp_regressor_shapes_and_validation() -> None:
    model = MLPRegressor(6, 3, hidden=(8, 8))
    assert model(torch.rand(5, 6)).shape == (5, 3)
    with pytest.raises(ValueError, match="out_dim >= 1"):
        MLPRegressor(6, 0)
    with pytest.raises(ValueError, match="optimizer must be 'sgd' or 'adam'"):
        LinearRegressor(optimizer="rmsprop")
    with pytest.raises(ValueError, match="lr must be > 0"):
        MLPRegressor(lr=0)


def test_tabular_mlp_has_three_layers() -> None:
    model = MLPClassifier(in_features=7, num_classes=2, hidden=(128, 128))
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 3
    assert model(torch.rand(3, 7)).shape == (3, 2)


def test_reference_classifiers_take_the_authors_solver_settings():
    import torch

    from lightning_fedcluster.models import FashionCNN, MLPClassifier

    for model in (FashionCNN(lr=0.06, momentum=0.9, weight_decay=5e-4), MLPClassifier(lr=0.06, momentum=0.9,
                                                                                        weight_decay=5e-4)):
        optimizer = model.configure_optimizers()
        assert isinstance(optimizer, torch.optim.SGD)
        assert optimizer.defaults["lr"] == 0.06 and optimizer.defaults["momentum"] == 0.9
        assert optimizer.defaults["weight_decay"] == 5e-4
    for bad, match in ((dict(weight_decay=-1.0), "weight_decay"), (dict(momentum=1.0), "momentum"),
                       (dict(lr=0.0), "lr")):
        with pytest.raises(ValueError, match=match):
            FashionCNN(**bad)
