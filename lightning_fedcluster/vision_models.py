"""torchvision MobileNetV2 and ResNet-18 as ordinary LightningModules for the CIFAR examples.

torchvision (the `vision` extra) is imported when a model is built. `norm="group"` swaps every
BatchNorm for GroupNorm, whose statistics are per sample and so need no running buffers that
federated averaging would mix across clients. Inputs are images in [0, 1]; the modules
normalise them with the ImageNet channel statistics (which pretrained weights expect).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lightning_fedcluster.models import ClassifierSteps

__all__ = ["MobileNetV2Classifier", "ResNet18Classifier", "group_norm"]

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def _torchvision_models() -> Any:
    try:
        import torchvision.models
    except ImportError as error:
        raise ImportError(
            "MobileNetV2Classifier / ResNet18Classifier are built on torchvision, which is not "
            "installed: install the vision extra (pip install 'lightning-fedcluster[vision]')"
        ) from error
    return torchvision.models


def group_norm(max_groups: int = 32) -> Callable[[int], nn.Module]:
    """A `norm_layer` for torchvision models: GroupNorm with the most groups (<= max_groups)
    that divide the channel count."""

    def make(channels: int) -> nn.Module:
        groups = math.gcd(channels, max_groups)
        return nn.GroupNorm(groups, channels)

    return make


def _norm_layer(norm: str, weights: str | None) -> Callable[[int], nn.Module] | None:
    if norm not in ("batch", "group"):
        raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")
    if norm == "group" and weights is not None:
        raise ValueError(
            f"weights={weights!r} are trained with BatchNorm and cannot load into norm='group'; "
            "pass weights=None or norm='batch'"
        )
    return group_norm() if norm == "group" else None


class _TorchvisionClassifier(ClassifierSteps):
    """Shared forward (ImageNet normalisation); training_step and SGD solver from ClassifierSteps."""

    net: nn.Module

    def _check(self, num_classes: int, lr: float) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        mean = torch.tensor(_MEAN, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        std = torch.tensor(_STD, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        return self.net((x - mean) / std)


class MobileNetV2Classifier(_TorchvisionClassifier):
    """torchvision's MobileNetV2 with a `num_classes` head (FedRC / FedEM's CIFAR model).

    Args:
        norm: "batch" (torchvision's default) or "group" (GroupNorm everywhere).
        weights: torchvision weights name, e.g. "IMAGENET1K_V1" (downloaded by torchvision; the
            FedRC paper starts from pretrained weights); None = random initialisation.
        width_mult: torchvision's channel width multiplier.
        lr, momentum, weight_decay: the SGD local solver (the paper: momentum 0.9).
    """

    def __init__(
        self,
        num_classes: int = 10,
        norm: str = "batch",
        weights: str | None = None,
        width_mult: float = 1.0,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self._check(num_classes, lr)
        norm_layer = _norm_layer(norm, weights)
        self.save_hyperparameters()
        models = _torchvision_models()
        net = models.mobilenet_v2(weights=weights, width_mult=width_mult, norm_layer=norm_layer)
        last = net.classifier[-1]
        net.classifier[-1] = nn.Linear(last.in_features, num_classes)
        self.net = net


class ResNet18Classifier(_TorchvisionClassifier):
    """torchvision's ResNet-18 with a `num_classes` head.

    Args:
        norm: "batch" or "group" (GroupNorm everywhere).
        cifar_stem: replace the ImageNet stem (7x7 stride-2 conv + max-pool) by a 3x3 stride-1 conv,
            the usual choice for 32x32 images.
        weights, lr, momentum, weight_decay: as in `MobileNetV2Classifier`.
    """

    def __init__(
        self,
        num_classes: int = 10,
        norm: str = "batch",
        weights: str | None = None,
        cifar_stem: bool = False,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self._check(num_classes, lr)
        norm_layer = _norm_layer(norm, weights)
        self.save_hyperparameters()
        models = _torchvision_models()
        net = models.resnet18(weights=weights, norm_layer=norm_layer)
        if cifar_stem:
            net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        net.fc = nn.Linear(net.fc.in_features, num_classes)
        self.net = net
