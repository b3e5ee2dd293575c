"""models.py: the reference models: regressors and classifiers with the authors' solver settings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fedcluster.models import LinearRegressor, MLPClassifier, MLPRegressor
from tests.conftest import NEEDS_VISION


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

    for model in (
        FashionCNN(lr=0.06, momentum=0.9, weight_decay=5e-4),
        MLPClassifier(lr=0.06, momentum=0.9, weight_decay=5e-4),
    ):
        optimizer = model.configure_optimizers()
        assert isinstance(optimizer, torch.optim.SGD)
        assert optimizer.defaults["lr"] == 0.06 and optimizer.defaults["momentum"] == 0.9
        assert optimizer.defaults["weight_decay"] == 5e-4
    for bad, match in (
        (dict(weight_decay=-1.0), "weight_decay"),
        (dict(momentum=1.0), "momentum"),
        (dict(lr=0.0), "lr"),
    ):
        with pytest.raises(ValueError, match=match):
            FashionCNN(**bad)


def test_fashion_cnn_widths_default_to_the_papers_and_shrink_for_the_cpu_recipe():
    from lightning_fedcluster.models import FashionCNN

    def count(model) -> int:
        return sum(p.numel() for p in model.parameters())

    paper = FashionCNN()
    assert count(paper) == 2_171_786  # conv 32, conv 64, fc 2048 at 28x28: the papers' network
    assert [paper.features[0].out_channels, paper.features[3].out_channels] == [32, 64]
    small = FashionCNN(channels=(16, 32), hidden=128)
    assert count(small) == 80_202 and small(torch.rand(3, 1, 28, 28)).shape == (3, 10)
    assert small.features[3].weight.is_contiguous(memory_format=torch.channels_last)
    for bad in (dict(channels=(16,)), dict(channels=(0, 8)), dict(hidden=0)):
        with pytest.raises(ValueError, match="FashionCNN needs .*two channel counts"):
            FashionCNN(**bad)


@pytest.fixture(scope="module")
def fashion_files(tmp_path_factory):
    pytest.importorskip("torchvision", reason=NEEDS_VISION)
    from tests.helpers.vision_files import write_fashion_mnist

    return write_fashion_mnist(tmp_path_factory.mktemp("fmnist"), n_train=300, n_test=60)


def _fit_fashion_cnn(root, executor: str, memory_format: torch.memory_format) -> list[torch.Tensor]:
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import FashionMNISTFederated
    from lightning_fedcluster.models import FashionCNN
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    dm = FashionMNISTFederated(root=str(root), num_clients=4, batch_size=32, seed=0, download=False)
    model = FashionCNN(lr=0.05, momentum=0.9).to(memory_format=memory_format)
    strategy = lf.FedRCStrategy(num_clusters=2, local_steps=2, executor=executor, optimizer_state="persist")
    trainer = make_trainer(strategy, 2, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    return list(trainer.lightning_module.models.parameters())


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_fashion_cnn_trains_channels_last_and_the_engine_keeps_the_layout(fashion_files, executor) -> None:
    """FashionCNN's convolution weights are channels-last (its speed on a CPU); the engine's
    in-place weight moves keep that layout through rounds, and the layout changes the result by
    float rounding only."""
    from lightning_fedcluster.models import FashionCNN

    conv = FashionCNN().features[3].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    trained = _fit_fashion_cnn(fashion_files, executor, torch.channels_last)
    convs = [p for p in trained if p.dim() == 4 and p.shape[1] > 1]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    reference = _fit_fashion_cnn(fashion_files, executor, torch.contiguous_format)
    assert all(p.is_contiguous() for p in reference)
    gap = max(float((a - b).abs().max()) for a, b in zip(trained, reference, strict=True))
    assert gap < 1e-4
