"""`corrupt`: one image corruption of a kind and severity, and the corruption families.

Feature shift is a corruption of one kind and severity (FashionMNIST-C / CIFAR-10-C style)
applied to all of a client's inputs. `FASHION_MNIST_C` and `CIFAR10_C` are the two papers'
families, `AUTHORS_*` the FedRC authors' pools; `corrupt` joins the default pool (`default`) and
the rest of the families (`extra`) behind one checked entry point.
"""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor

from lightning_fedcluster.datamodules.shifts.default import DEFAULT_FUNCTIONS, DEFAULT_PARAMS
from lightning_fedcluster.datamodules.shifts.extra import EXTRA_FUNCTIONS, EXTRA_PARAMS

__all__ = [
    "ALL_CORRUPTIONS",
    "AUTHORS_CIFAR10_C",
    "AUTHORS_FASHION_MNIST_C",
    "CIFAR10_C",
    "FASHION_MNIST_C",
    "corrupt",
]

_PARAMS = {**DEFAULT_PARAMS, **EXTRA_PARAMS}
_FUNCTIONS = {**DEFAULT_FUNCTIONS, **EXTRA_FUNCTIONS}

ALL_CORRUPTIONS: tuple[str, ...] = tuple(_FUNCTIONS)
"""Every name `corrupt` accepts."""

FASHION_MNIST_C: tuple[str, ...] = (
    "shot_noise",
    "impulse_noise",
    "glass_blur",
    "motion_blur",
    "shear",
    "scale",
    "rotate",
    "brightness",
    "contrast",
    "inverse",
)
"""The FashionMNIST-C family (MNIST-C style) for grayscale images. Its flips and turns have no
severity and saturation has no effect on one channel, so they are left out. Pure torch."""

CIFAR10_C: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "speckle_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "gaussian_blur",
    "fog",
    "brightness",
    "contrast",
    "saturate",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
"""The CIFAR-10-C family for colour images (its snow, frost and spatter, which need texture
images or particle simulation, are left out). Needs torchvision for three kinds."""


AUTHORS_FASHION_MNIST_C: tuple[str, ...] = ("identity", *FASHION_MNIST_C[:8], "translate", "stripe")
"""The FedRC authors' FashionMNIST-C pool (create_c/make_fmnist_c.py: 15 kinds drawn uniformly,
`identity` among them) less the four this library does not implement: spatter, dotted_line,
zigzag and canny_edges. Pure torch."""

AUTHORS_CIFAR10_C: tuple[str, ...] = CIFAR10_C
"""The FedRC authors' CIFAR-10-C pool (create_c/make_cifar_c.py: the 19 CIFAR-10-C kinds) less
snow, frost and spatter: the 16 kinds of `CIFAR10_C`."""


def corrupt(images: Tensor, kind: str, severity: int, generator: torch.Generator) -> Tensor:
    """Corrupt float images [N, C, H, W] in [0, 1] with `kind` (any of `ALL_CORRUPTIONS`) at
    `severity` (1..5).

    Randomness (noise, signs, directions) comes only from `generator`, so a seeded generator
    gives identical output. The result is a new tensor clamped to [0, 1].
    """
    if not isinstance(images, Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.ndim != 4:
        raise ValueError(
            f"images must have shape [N, C, H, W], got shape {tuple(images.shape)}; "
            "reshape flat inputs to their image shape first"
        )
    if not images.is_floating_point():
        raise TypeError(
            f"images must be a floating-point tensor scaled to [0, 1], got dtype {images.dtype}; "
            "convert with images.float() / 255 (or the data's maximum)"
        )
    if kind not in _FUNCTIONS:
        raise ValueError(f"kind must be one of {', '.join(ALL_CORRUPTIONS)}; got {kind!r}")
    if isinstance(severity, bool) or not isinstance(severity, Integral) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
            f"got {type(generator).__name__}"
        )
    if images.shape[0] == 0:
        return images.clone()
    out = _FUNCTIONS[kind](images, _PARAMS[kind][severity - 1], generator)
    return out.clamp(0.0, 1.0)
