"""Distribution shifts applied per client: concept label maps and image corruptions.

Concept shift is a permutation of the labels (FedRC App. H.8); feature shift is a corruption of
one kind and severity (FashionMNIST-C / CIFAR-10-C style) applied to all of a client's inputs.
The default pool `CORRUPTIONS` is pure torch (no torchvision) so it runs with the CPU-only
wheel. `FASHION_MNIST_C` and `CIFAR10_C` are the two papers' families; the CIFAR-10-C kinds that
torchvision implements (`TORCHVISION_CORRUPTIONS`: JPEG, elastic transform, saturation) use it,
imported when first applied (the `vision` extra).

The label maps live in `label_maps`, the default pool in `corruptions_default` and the rest of
the families in `corruptions_extra`; this module joins them behind `corrupt` and re-exports them.
"""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor

from lightning_fedcluster.datamodules.corruptions_default import (
    CORRUPTIONS,
    DEFAULT_FUNCTIONS,
    DEFAULT_PARAMS,
)
from lightning_fedcluster.datamodules.corruptions_extra import (
    EXTRA_FUNCTIONS,
    EXTRA_PARAMS,
    SEVERITY_FREE,
    TORCHVISION_CORRUPTIONS,
)
from lightning_fedcluster.datamodules.label_maps import label_map, max_concepts

__all__ = [
    "ALL_CORRUPTIONS",
    "AUTHORS_CIFAR10_C",
    "AUTHORS_FASHION_MNIST_C",
    "CIFAR10_C",
    "CORRUPTIONS",
    "FASHION_MNIST_C",
    "SEVERITY_FREE",
    "TORCHVISION_CORRUPTIONS",
    "corrupt",
    "label_map",
    "max_concepts",
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
