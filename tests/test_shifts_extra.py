"""The FashionMNIST-C / CIFAR-10-C corruption families beyond the default pool."""

import sys

import pytest
import torch
import torch.nn.functional as F

from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.datamodules.digits import load_digits_tensors
from lightning_fedcluster.datamodules.shifts import (
    ALL_CORRUPTIONS,
    CIFAR10_C,
    CORRUPTIONS,
    FASHION_MNIST_C,
    TORCHVISION_CORRUPTIONS,
    corrupt,
)

EXTRA = [k for k in ALL_CORRUPTIONS if k not in CORRUPTIONS]
PURE_EXTRA = [k for k in EXTRA if k not in TORCHVISION_CORRUPTIONS]
GRAYSCALE_OK = [k for k in ALL_CORRUPTIONS if k != "saturate"]


@pytest.fixture(scope="module")
def digits8() -> torch.Tensor:
    x, _ = load_digits_tensors()
    return x[:32].reshape(-1, 1, 8, 8)


@pytest.fixture(scope="module")
def gray28(digits8: torch.Tensor) -> torch.Tensor:
    return F.interpolate(digits8[:16], size=(28, 28), mode="bilinear", align_corners=False)


@pytest.fixture(scope="module")
def colour32() -> torch.Tensor:
    noise = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return F.interpolate(noise, size=(32, 32), mode="bilinear", align_corners=False)  # smooth images


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def change(images: torch.Tensor, kind: str, severity: int) -> float:
    return (corrupt(images, kind, severity, gen(0)) - images).abs().mean().item()


def needs_torchvision(kind: str) -> None:
    if kind in TORCHVISION_CORRUPTIONS:
        pytest.importorskip("torchvision")


def test_default_pool_is_unchanged_and_families_are_known() -> None:
    assert CORRUPTIONS == (
        "gaussian_noise", "shot_noise", "impulse_noise", "gaussian_blur", "brightness", "contrast",
        "rotate", "shear", "scale", "translate", "pixelate", "elastic",
    )
    assert set(FASHION_MNIST_C) <= set(ALL_CORRUPTIONS) and set(CIFAR10_C) <= set(ALL_CORRUPTIONS)
    assert not set(FASHION_MNIST_C) & set(TORCHVISION_CORRUPTIONS)  # grayscale family: pure torch
    assert set(TORCHVISION_CORRUPTIONS) <= set(CIFAR10_C)
    assert len(CIFAR10_C) == 16 and len(FASHION_MNIST_C) == 10


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


@pytest.mark.parametrize("kind", EXTRA)
@pytest.mark.parametrize("size", ["gray8", "gray28", "colour32"])
def test_extra_severity_is_monotone(
    kind: str, size: str, digits8: torch.Tensor, gray28: torch.Tensor, colour32: torch.Tensor
) -> None:
    needs_torchvision(kind)
    images = {"gray8": digits8, "gray28": gray28, "colour32": colour32}[size]
    if kind == "saturate" and images.shape[1] == 1:
        pytest.skip("saturation is defined for colour images only")
    strengths = [change(images, kind, s) for s in range(1, 6)]
    assert all(b > a for a, b in zip(strengths, strengths[1:], strict=False)), strengths


def test_saturate_rejects_grayscale(digits8: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="saturate needs colour images"):
        corrupt(digits8, "saturate", 2, gen())


@pytest.mark.parametrize("kind", TORCHVISION_CORRUPTIONS)
def test_torchvision_kinds_name_the_vision_extra_when_missing(
    kind: str, colour32: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    with pytest.raises(ImportError, match=r"lightning-fedcluster\[vision\]"):
        corrupt(colour32, kind, 1, gen())


def test_pure_kinds_work_without_torchvision(
    colour32: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    for kind in PURE_EXTRA + list(CORRUPTIONS):
        assert corrupt(colour32[:2], kind, 2, gen()).shape == colour32[:2].shape


def test_scenario_draws_from_the_given_family() -> None:
    x, y = load_digits_tensors()
    plain = FederatedDataModule.from_tensors(x, y, num_clients=12, image_shape=(1, 8, 8), seed=1,
                                             corrupt_fraction=0)
    dm = FederatedDataModule.from_tensors(x, y, num_clients=12, image_shape=(1, 8, 8), seed=1,
                                          corrupt_fraction=0.5, corruptions=FASHION_MNIST_C)
    styles = dm.metadata.feature_style
    corrupted = [i for i, s in enumerate(styles) if s != "clean"]
    assert len(corrupted) == 6
    assert all(styles[i].split(":")[0] in FASHION_MNIST_C for i in corrupted)
    for i in range(12):
        same = torch.equal(dm.train_split(i)[0], plain.train_split(i)[0])
        assert same == (i not in corrupted)
        assert torch.equal(dm.train_split(i)[1], plain.train_split(i)[1])
    with pytest.raises(ValueError, match="corruptions has unknown kinds"):
        FederatedDataModule.from_tensors(x, y, num_clients=4, image_shape=(1, 8, 8), corruptions=["fogg"])
    with pytest.raises(ValueError, match="corruptions must be a non-empty list"):
        FederatedDataModule.from_tensors(x, y, num_clients=4, image_shape=(1, 8, 8), corruptions=[])
