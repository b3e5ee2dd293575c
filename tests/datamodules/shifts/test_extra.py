"""The FashionMNIST-C / CIFAR-10-C corruption families beyond the default pool, the torchvision-based
kinds and the authors' severity-free kinds."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from lightning_fedcluster.datamodules import shifts
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.datamodules.shifts import (
    ALL_CORRUPTIONS,
    CORRUPTIONS,
    SEVERITY_FREE,
    TORCHVISION_CORRUPTIONS,
    corrupt,
)
from tests.conftest import NEEDS_VISION
from tests.datamodules.shifts.test_default import gen

EXTRA = [k for k in ALL_CORRUPTIONS if k not in CORRUPTIONS and k not in SEVERITY_FREE]


PURE_EXTRA = [k for k in EXTRA if k not in TORCHVISION_CORRUPTIONS]


GRAYSCALE_OK = [k for k in ALL_CORRUPTIONS if k != "saturate"]


@pytest.fixture(scope="module")
def digits8_32() -> torch.Tensor:
    """The first 32 digits (the families' checks below; ``digits8`` above holds 64)."""
    x, _ = load_digits_tensors()
    return x[:32].reshape(-1, 1, 8, 8)


@pytest.fixture(scope="module")
def gray28(digits8_32: torch.Tensor) -> torch.Tensor:
    return F.interpolate(digits8_32[:16], size=(28, 28), mode="bilinear", align_corners=False)


@pytest.fixture(scope="module")
def colour32() -> torch.Tensor:
    noise = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return F.interpolate(noise, size=(32, 32), mode="bilinear", align_corners=False)  # smooth images


def change(images: torch.Tensor, kind: str, severity: int) -> float:
    return (corrupt(images, kind, severity, gen(0)) - images).abs().mean().item()


def needs_torchvision(kind: str) -> None:
    if kind in TORCHVISION_CORRUPTIONS:
        pytest.importorskip("torchvision", reason=NEEDS_VISION)


@pytest.mark.parametrize("kind", EXTRA)
def test_extra_corruptions_are_valid_and_reproducible(kind: str, colour32: torch.Tensor) -> None:
    needs_torchvision(kind)
    before = colour32.clone()
    out = corrupt(colour32, kind, 3, gen(1))
    assert torch.equal(colour32, before)
    assert out.shape == colour32.shape and out.dtype == colour32.dtype
    assert out.min() >= 0 and out.max() <= 1
    assert (out - colour32).abs().mean() > 1e-3
    assert torch.equal(out, corrupt(colour32, kind, 3, gen(1)))


# saturation is defined for colour images only (test_saturate_rejects_grayscale)
SEVERITY_CASES = [
    (kind, size) for size in ("gray8", "gray28", "colour32") for kind in EXTRA
    if kind != "saturate" or size == "colour32"
]  # fmt: skip


@pytest.mark.parametrize(("kind", "size"), SEVERITY_CASES)
def test_extra_severity_is_monotone(
    kind: str, size: str, digits8_32: torch.Tensor, gray28: torch.Tensor, colour32: torch.Tensor
) -> None:
    needs_torchvision(kind)
    images = {"gray8": digits8_32, "gray28": gray28, "colour32": colour32}[size]
    strengths = [change(images, kind, s) for s in range(1, 6)]
    assert all(b > a for a, b in zip(strengths, strengths[1:], strict=False)), strengths


def test_saturate_rejects_grayscale(digits8_32: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="saturate needs colour images"):
        corrupt(digits8_32, "saturate", 2, gen())


@pytest.mark.parametrize("kind", TORCHVISION_CORRUPTIONS)
def test_torchvision_kinds_name_the_vision_extra_when_missing(
    kind: str, colour32: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    with pytest.raises(ImportError, match=r"lightning-fedcluster\[vision\]"):
        corrupt(colour32, kind, 1, gen())


def test_pure_kinds_work_without_torchvision(colour32: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    for kind in PURE_EXTRA + list(CORRUPTIONS):
        assert corrupt(colour32[:2], kind, 2, gen()).shape == colour32[:2].shape


def test_severity_free_kinds() -> None:
    images = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(shifts.corrupt(images, "identity", 4, generator), images)
    striped = shifts.corrupt(images, "stripe", 1, generator)
    assert torch.allclose(striped[..., :7], 1 - images[..., :7])  # the authors' columns 0..6
    assert torch.allclose(striped[..., 21:], 1 - images[..., 21:])  # and 21..27
    assert torch.equal(striped[..., 7:21], images[..., 7:21])
    assert torch.equal(shifts.corrupt(images, "stripe", 5, generator), striped)
