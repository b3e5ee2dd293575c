"""The default, pure-torch corruption pool: valid, reproducible, monotone in severity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_fedcluster.datamodules.shifts import CORRUPTIONS, corrupt

REQUIRED = {
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
}


@pytest.fixture(scope="module")
def images28(digits8: torch.Tensor) -> torch.Tensor:
    return F.interpolate(digits8, size=(28, 28), mode="bilinear", align_corners=False)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_required_corruptions_available() -> None:
    assert REQUIRED <= set(CORRUPTIONS)
    assert len(set(CORRUPTIONS)) == len(CORRUPTIONS)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corruption_output_is_valid_and_reproducible(kind: str, digits8: torch.Tensor) -> None:
    before = digits8.clone()
    out = corrupt(digits8, kind, 3, gen(1))
    assert torch.equal(digits8, before), "input modified in place"
    assert out.shape == digits8.shape and out.dtype == digits8.dtype
    assert out.min() >= 0 and out.max() <= 1
    assert (out - digits8).abs().mean() > 1e-3
    assert torch.equal(out, corrupt(digits8, kind, 3, gen(1)))


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corruption_handles_non_square_colour_images(kind: str) -> None:
    images = torch.rand(3, 3, 12, 20, generator=gen(5))
    out = corrupt(images, kind, 5, gen(0))
    assert out.shape == images.shape
    assert out.min() >= 0 and out.max() <= 1
    assert not torch.equal(out, images)


@pytest.mark.parametrize("size", [8, 28])
@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_severity_is_monotone(kind: str, size: int, digits8: torch.Tensor, images28: torch.Tensor) -> None:
    images = digits8 if size == 8 else images28
    change = [(corrupt(images, kind, s, gen(0)) - images).abs().mean().item() for s in range(1, 6)]
    assert all(b > a for a, b in zip(change, change[1:], strict=False)), change


@pytest.mark.parametrize("kind", ["gaussian_noise", "shot_noise", "impulse_noise", "elastic"])
def test_different_generators_give_different_noise(kind: str, digits8: torch.Tensor) -> None:
    assert not torch.equal(corrupt(digits8, kind, 3, gen(0)), corrupt(digits8, kind, 3, gen(1)))
