"""Concept label maps and pure-torch image corruptions, and the FashionMNIST-C / CIFAR-10-C
corruption families beyond the default pool."""

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
    SEVERITY_FREE,
    TORCHVISION_CORRUPTIONS,
    corrupt,
    label_map,
    max_concepts,
)
from tests.conftest import NEEDS_VISION

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
def digits8() -> torch.Tensor:
    x, _ = load_digits_tensors()
    return x[:64].reshape(-1, 1, 8, 8)


@pytest.fixture(scope="module")
def images28(digits8: torch.Tensor) -> torch.Tensor:
    return F.interpolate(digits8, size=(28, 28), mode="bilinear", align_corners=False)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- label maps ------------------------------------------------------------------------------


def test_label_maps_match_the_paper() -> None:
    y = torch.arange(10)
    assert torch.equal(label_map(0, 10), y)
    assert torch.equal(label_map(1, 10), 9 - y)
    assert torch.equal(label_map(2, 10), (y + 1) % 10)
    assert torch.equal(label_map(3, 10), (y + 2) % 10)
    assert label_map(0, 10).dtype == torch.long


@pytest.mark.parametrize("num_classes", [2, 3, 4, 7, 10])
def test_label_maps_are_distinct_permutations(num_classes: int) -> None:
    tables = [label_map(c, num_classes) for c in range(max_concepts(num_classes))]
    for table in tables:
        assert torch.equal(table.sort().values, torch.arange(num_classes))
    assert len({tuple(t.tolist()) for t in tables}) == len(tables)


def test_max_concepts() -> None:
    assert max_concepts(2) == 2
    assert max_concepts(3) == 4
    assert max_concepts(10) == 11


def test_label_map_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="concept must be .* distinct label maps"):
        label_map(2, 2)
    with pytest.raises(ValueError, match="concept"):
        label_map(-1, 10)
    with pytest.raises(ValueError, match="num_classes"):
        label_map(0, 1)


# --- corruptions -----------------------------------------------------------------------------


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
def test_severity_is_monotone(
    kind: str, size: int, digits8: torch.Tensor, images28: torch.Tensor
) -> None:
    images = digits8 if size == 8 else images28
    change = [(corrupt(images, kind, s, gen(0)) - images).abs().mean().item() for s in range(1, 6)]
    assert all(b > a for a, b in zip(change, change[1:], strict=False)), change


@pytest.mark.parametrize("kind", ["gaussian_noise", "shot_noise", "impulse_noise", "elastic"])
def test_different_generators_give_different_noise(kind: str, digits8: torch.Tensor) -> None:
    assert not torch.equal(corrupt(digits8, kind, 3, gen(0)), corrupt(digits8, kind, 3, gen(1)))


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


# --- the FashionMNIST-C / CIFAR-10-C corruption families beyond the default pool --------------


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
