"""vision_models.py: the torchvision MobileNetV2 and ResNet-18 classifiers, their options, and the
message naming the extra when torchvision is missing."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from tests.conftest import NEEDS_VISION


@pytest.mark.parametrize("name", ["MobileNetV2Classifier", "ResNet18Classifier"])
@pytest.mark.parametrize("norm", ["batch", "group"])
def test_torchvision_models(name: str, norm: str) -> None:
    pytest.importorskip("torchvision", reason=NEEDS_VISION)
    from lightning_fedcluster import vision_models

    model = getattr(vision_models, name)(num_classes=10, norm=norm, lr=0.05)
    model.eval()
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    kinds = {type(m) for m in model.modules()}
    if norm == "group":
        assert nn.GroupNorm in kinds and nn.BatchNorm2d not in kinds
    else:
        assert nn.BatchNorm2d in kinds and nn.GroupNorm not in kinds
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["lr"] == 0.05
    assert optimizer.defaults["momentum"] == 0.9


def test_torchvision_model_options() -> None:
    pytest.importorskip("torchvision", reason=NEEDS_VISION)
    from lightning_fedcluster.vision_models import MobileNetV2Classifier, ResNet18Classifier

    resnet = ResNet18Classifier(num_classes=100, cifar_stem=True)
    assert resnet.net.conv1.stride == (1, 1) and isinstance(resnet.net.maxpool, nn.Identity)
    assert resnet(torch.rand(1, 3, 32, 32)).shape == (1, 100)
    with pytest.raises(ValueError, match="cannot load into norm='group'"):
        MobileNetV2Classifier(norm="group", weights="IMAGENET1K_V1")
    with pytest.raises(ValueError, match="norm must be 'batch' or 'group'"):
        ResNet18Classifier(norm="layer")


def test_torchvision_models_name_the_extra_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fedcluster.vision_models import MobileNetV2Classifier

    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(ImportError, match=r"lightning-fedcluster\[vision\]"):
        MobileNetV2Classifier()
