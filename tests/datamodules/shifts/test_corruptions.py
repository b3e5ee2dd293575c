"""`corrupt`, the one checked entry point, and the corruption families (the papers' and the authors')."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules import shifts
from lightning_fedcluster.datamodules.shifts import (
    ALL_CORRUPTIONS,
    CIFAR10_C,
    CORRUPTIONS,
    FASHION_MNIST_C,
    TORCHVISION_CORRUPTIONS,
    corrupt,
)
from tests.datamodules.shifts.test_default import gen


def test_empty_batch_passes_through() -> None:
    empty = torch.empty(0, 1, 8, 8)
    assert corrupt(empty, "rotate", 2, gen()).shape == (0, 1, 8, 8)


def test_corrupt_rejects_bad_arguments(digits8: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        corrupt(digits8, "jpeg_fog", 1, gen())
    for severity in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match="severity must be an integer in 1..5"):
            corrupt(digits8, "rotate", severity, gen())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"images must have shape \[N, C, H, W\]"):
        corrupt(digits8.reshape(-1, 64), "rotate", 1, gen())
    with pytest.raises(TypeError, match="images must be a floating-point"):
        corrupt((digits8 * 16).to(torch.uint8), "rotate", 1, gen())
    with pytest.raises(TypeError, match="images must be a torch.Tensor"):
        corrupt(digits8.numpy(), "rotate", 1, gen())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        corrupt(digits8, "rotate", 1, 0)  # type: ignore[arg-type]


def test_default_pool_is_unchanged_and_families_are_known() -> None:
    assert CORRUPTIONS == (
        "gaussian_noise",
        "shot_noise",
        "impulse_noise",
        "gaussian_blur",
        "brightness",
        "contrast",
        "rotate",
        "shear",
        "scale",
        "translate",
        "pixelate",
        "elastic",
    )
    assert set(FASHION_MNIST_C) <= set(ALL_CORRUPTIONS) and set(CIFAR10_C) <= set(ALL_CORRUPTIONS)
    assert not set(FASHION_MNIST_C) & set(TORCHVISION_CORRUPTIONS)  # grayscale family: pure torch
    assert set(TORCHVISION_CORRUPTIONS) <= set(CIFAR10_C)
    assert len(CIFAR10_C) == 16 and len(FASHION_MNIST_C) == 10


def test_authors_pools_are_their_lists_less_the_kinds_not_implemented() -> None:
    fmnist = [
        "identity",
        "shot_noise",
        "impulse_noise",
        "glass_blur",
        "motion_blur",
        "shear",
        "scale",
        "rotate",
        "brightness",
        "translate",
        "stripe",
        "spatter",
        "dotted_line",
        "zigzag",
        "canny_edges",
    ]
    cifar = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
             "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
             "jpeg_compression", "speckle_noise", "gaussian_blur", "spatter", "saturate"]  # fmt: skip
    assert shifts.AUTHORS_FASHION_MNIST_C == tuple(k for k in fmnist if k in shifts.ALL_CORRUPTIONS)
    assert len(shifts.AUTHORS_FASHION_MNIST_C) == 11
    assert set(shifts.AUTHORS_CIFAR10_C) == {k for k in cifar if k in shifts.ALL_CORRUPTIONS}
    assert len(shifts.AUTHORS_CIFAR10_C) == 16
