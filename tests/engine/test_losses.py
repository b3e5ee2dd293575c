"""engine/losses.py: no-grad passes hold at most PASS_ACTIVATION_BYTES of activations (wide models get
fewer rows per pass, K times fewer when K models run at once; small ones keep eval_batch_size), and
the default regression loss is the per-sample squared error."""

from __future__ import annotations

import torch

import lightning_fedcluster as lf
from lightning_fedcluster.engine.losses import PASS_ACTIVATION_BYTES, activation_bytes_per_sample, pass_rows
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.models import FashionCNN, LinearRegressor, MLPClassifier


def test_a_cnn_pass_is_bounded_by_activation_bytes_and_an_mlp_keeps_its_cap():
    images = torch.rand(2, 1, 28, 28)
    per_row = activation_bytes_per_sample(FashionCNN(), images)
    assert per_row > 32 * 24 * 24 * 4  # at least the first conv layer's output
    rows = pass_rows(FashionCNN(), images, 4096)
    assert rows < 4096 and rows * per_row <= PASS_ACTIVATION_BYTES
    stacked = pass_rows(FashionCNN(), images, 4096, copies=3)
    assert stacked * 3 * per_row <= PASS_ACTIVATION_BYTES and stacked < rows
    assert pass_rows(MLPClassifier(), torch.rand(2, 64), 4096) == 4096
    assert pass_rows(MLPClassifier(), torch.rand(2, 64), 100) == 100  # never above eval_batch_size


def test_regression_default_loss_is_the_per_sample_squared_error(synthetic):
    module = lf.ClusteredModule(LinearRegressor(10, 1, bias=False), 2, seed=0)
    module.task = Task.REGRESSION
    x, y = synthetic.train_split(0)
    expected = (module.models[1](x).squeeze(1) - y).square()
    torch.testing.assert_close(module.per_sample_loss(1, x, y), expected)
