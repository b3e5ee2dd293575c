"""Reference classifiers: ordinary LightningModules, as a user would write them. The engine
uses only their ``forward`` (logits) and ``configure_optimizers``; their ``training_step`` is
there so they also train on their own with a plain Trainer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fedcluster.engine.setup_checks import FLAT_DATA_FIX


def mlp(in_features: int, hidden: Sequence[int], out_features: int) -> nn.Sequential:
    """Linear → ReLU blocks through ``hidden``, then a linear output layer."""
    sizes = [in_features, *hidden]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], out_features))
    return nn.Sequential(*layers)


class ClassifierSteps(pl.LightningModule):
    """What the reference classifiers share: a cross-entropy ``training_step`` (so they also train
    on their own) and an SGD solver from the hyperparameters ``lr``, ``momentum`` and, when
    present, ``weight_decay``."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        return torch.optim.SGD(
            self.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.get("weight_decay", 0.0)
        )


class RegressorSteps(pl.LightningModule):
    """What the reference regressors share: an MSE ``training_step`` and the solver named by the
    hyperparameter ``optimizer`` ("sgd" or "adam")."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.mse_loss(self(x).reshape(y.shape), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        return _make_optimizer(self.parameters(), hp.optimizer, hp.lr, hp.momentum)


class MLPClassifier(ClassifierSteps):
    """A multilayer perceptron on flat inputs (e.g. scikit-learn digits: 64 features, 10 classes)."""

    def __init__(
        self,
        in_features: int = 64,
        num_classes: int = 10,
        hidden: Sequence[int] = (128,),
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        check_solver(lr, momentum, weight_decay)
        if in_features < 1 or num_classes < 2 or any(h < 1 for h in hidden):
            raise ValueError(
                f"MLPClassifier needs in_features >= 1, num_classes >= 2 and positive hidden sizes, got "
                f"in_features={in_features}, num_classes={num_classes}, hidden={tuple(hidden)}"
            )
        self.save_hyperparameters()
        self.net = mlp(in_features, hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1))


class FashionCNN(ClassifierSteps):
    """The FedRC/FedEM papers' FashionMNIST network: conv(32, 5×5) → pool → conv(64, 5×5) → pool →
    fc 2048 → logits. Works for any square grayscale or colour input of side ``image_size``.

    ``channels`` and ``hidden`` change the widths (default: the paper's 32, 64 and 2048, 2.17 M
    parameters at 28×28). ``channels=(16, 32), hidden=128`` is the CPU recipe's network
    (docs/how-to/images-on-cpu.md): 80 k parameters, a local step about 5× cheaper."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        channels: Sequence[int] = (32, 64),
        hidden: int = 2048,
    ) -> None:
        super().__init__()
        check_solver(lr, momentum, weight_decay)
        side = ((image_size - 4) // 2 - 4) // 2
        if num_classes < 2 or in_channels < 1 or side < 1 or len(channels) != 2 or min(*channels, hidden) < 1:
            raise ValueError(
                f"FashionCNN needs num_classes >= 2, in_channels >= 1, image_size >= 16, two channel counts "
                f">= 1 and hidden >= 1, got num_classes={num_classes}, in_channels={in_channels}, "
                f"image_size={image_size}, channels={tuple(channels)}, hidden={hidden}"
            )
        self.save_hyperparameters()
        first, second = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, first, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(first, second, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(second * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )
        # Channels-last convolution weights make the convolutions and max-pools run channels-last:
        # on a CPU (oneDNN) one local step is ~1.2x and a no-grad pass ~1.7x faster than in NCHW
        # (benchmarks/results/training_round.md). The engine moves weights with in-place copies,
        # which keep it.
        self.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(image_batch(x, "FashionCNN")))


class SmallCNN(ClassifierSteps):
    """A small convolutional network for small images, e.g. the digits as 8×8 images
    (``DigitsFederated(as_images=True)``): two 3×3 convolutions (``channels``) → 2×2 max-pool →
    fc ``hidden`` → logits. Inputs are [N, ``in_channels``, ``image_size``, ``image_size``]."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        channels: Sequence[int] = (16, 32),
        hidden: int = 64,
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        check_solver(lr, momentum, weight_decay)
        if num_classes < 2 or in_channels < 1 or image_size < 2 or len(channels) != 2 or hidden < 1:
            raise ValueError(
                f"SmallCNN needs num_classes >= 2, in_channels >= 1, image_size >= 2, two channel counts "
                f"and hidden >= 1, got num_classes={num_classes}, in_channels={in_channels}, "
                f"image_size={image_size}, channels={tuple(channels)}, hidden={hidden}"
            )
        self.save_hyperparameters()
        first, second = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, first, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(first, second, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 2
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(second * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(image_batch(x, "SmallCNN")))


def image_batch(x: Tensor, model: str) -> Tensor:
    """``x`` as [N, C, H, W] (a grayscale [N, H, W] gains its channel); flat [N, features] inputs
    are refused with the options that give images, instead of a raw conv2d error."""
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(
            f"{model} needs image inputs [N, C, H, W], got shape {tuple(x.shape)}: " + FLAT_DATA_FIX
        )
    return x


class LinearRegressor(RegressorSteps):
    """Linear regression ŷ = W x (+ b), output [batch, out_dim]; FedSoft's synthetic model is
    ``LinearRegressor(10, 1, bias=False, optimizer="adam", lr=5e-3)`` with Xavier-normal init.

    Args:
        optimizer: "sgd" (with ``momentum``) or "adam" — the local solver of every client.
    """

    def __init__(
        self,
        in_features: int = 10,
        out_dim: int = 1,
        bias: bool = False,
        lr: float = 5e-3,
        optimizer: str = "adam",
        momentum: float = 0.0,
    ) -> None:
        super().__init__()
        if in_features < 1 or out_dim < 1:
            raise ValueError(
                f"LinearRegressor needs in_features >= 1 and out_dim >= 1, got {in_features}, {out_dim}"
            )
        _check_optimizer(lr, optimizer)
        self.save_hyperparameters()
        self.linear = nn.Linear(in_features, out_dim, bias=bias)
        nn.init.xavier_normal_(self.linear.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1))


class MLPRegressor(RegressorSteps):
    """A multilayer perceptron for regression on flat inputs, output [batch, out_dim]."""

    def __init__(
        self,
        in_features: int = 10,
        out_dim: int = 1,
        hidden: Sequence[int] = (64,),
        lr: float = 0.01,
        optimizer: str = "sgd",
        momentum: float = 0.0,
    ) -> None:
        super().__init__()
        if in_features < 1 or out_dim < 1 or any(h < 1 for h in hidden):
            raise ValueError(
                f"MLPRegressor needs in_features >= 1, out_dim >= 1 and positive hidden sizes, got "
                f"in_features={in_features}, out_dim={out_dim}, hidden={tuple(hidden)}"
            )
        _check_optimizer(lr, optimizer)
        self.save_hyperparameters()
        self.net = mlp(in_features, hidden, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1))


def _check_optimizer(lr: float, optimizer: str) -> None:
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")


def check_solver(lr: float, momentum: float, weight_decay: float) -> None:
    """The local SGD's settings: lr > 0, momentum in [0, 1), weight_decay >= 0."""
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0 (FedRC's authors use 5e-4), got {weight_decay!r}")


def _make_optimizer(params: Any, name: str, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)
