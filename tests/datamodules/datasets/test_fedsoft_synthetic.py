"""FedSoft's synthetic benchmark matches its stated distributions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules.datasets.fedsoft_synthetic import (
    FedSoftSynthetic,
    generate_fedsoft_data,
)


@pytest.fixture(scope="module")
def data() -> dict:
    return generate_fedsoft_data(num_clients=100, num_sources=8, pattern="random", seed=0)


def test_sizes_and_mixtures(data: dict) -> None:
    sizes = np.array([p.size for p in data["parts"]])
    assert sizes.min() >= 100 and sizes.max() <= 200 and 135 < sizes.mean() < 165  # U{100..200}
    counts = data["counts"].numpy()
    assert (counts.sum(axis=1) == sizes).all()
    assert np.abs(counts / sizes[:, None] - data["mixture"].numpy()).max() <= 1 / 100
    for i, part in enumerate(data["parts"]):  # the rows of client i come from its counts
        assert np.bincount(data["source"][part].numpy(), minlength=8).tolist() == counts[i].tolist()


def test_inputs_parameters_and_noise(data: dict) -> None:
    x, y, theta, source = data["x"].double(), data["y"].double(), data["theta"].double(), data["source"]
    assert x.shape[1] == 10 and theta.shape == (8, 10)
    assert abs(float(x.mean())) < 0.02 and abs(float(x.var()) - 1) < 0.03  # x ~ N(0, I)
    assert 50 < float(theta.var()) < 150  # θ ~ N(0, 10² I): 80 draws
    residual = y - (x * theta[source]).sum(dim=1)
    assert abs(float(residual.mean())) < 0.03 and abs(float(residual.var()) - 1) < 0.05  # ε ~ N(0, 1)
    for s, (gx, gy) in enumerate(data["global_test"]):
        assert gx.shape == (1000, 10)
        r = gy.double() - gx.double() @ theta[s]
        assert abs(float(r.var()) - 1) < 0.15


def test_datamodule_is_a_regression_task_with_true_mixtures() -> None:
    dm = FedSoftSynthetic(num_clients=20, pattern="10:90", global_test_size=50, seed=3)
    assert dm.task == "regression" and dm.num_classes is None and dm.output_size == 1
    assert dm.num_clients == 20 and dm.num_global_clients == 2 and dm.batch_size == 10
    mixture = dm.metadata.mixture
    assert sorted(mixture[:, 0].tolist()) == pytest.approx([0.1] * 10 + [0.9] * 10)
    assert torch.equal(dm.metadata.concept, mixture.argmax(dim=1))
    assert dm.metadata.global_concept.tolist() == [0, 1]
    assert dm.theta.shape == (2, 10)
    sizes = dm.train_sizes + dm.val_sizes + dm.test_sizes
    assert sizes.min() >= 100 and sizes.max() <= 200
    again = FedSoftSynthetic(num_clients=20, pattern="10:90", global_test_size=50, seed=3)
    assert torch.equal(dm.train_x, again.train_x) and torch.equal(dm.train_y, again.train_y)


@pytest.mark.parametrize("pattern", ["30:70", "linear"])
def test_two_source_patterns(pattern: str) -> None:
    dm = FedSoftSynthetic(num_clients=10, pattern=pattern, global_test_size=0, seed=0)
    assert dm.num_global_clients == 0
    assert torch.allclose(dm.metadata.mixture.sum(dim=1), torch.ones(10))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="use pattern='random' for more sources"):
        FedSoftSynthetic(num_sources=3, pattern="linear")
    with pytest.raises(ValueError, match="max_samples must be an integer >= 100"):
        FedSoftSynthetic(max_samples=50)
    with pytest.raises(ValueError, match="sigma0 must be a number >= 0"):
        FedSoftSynthetic(sigma0=-1.0)
