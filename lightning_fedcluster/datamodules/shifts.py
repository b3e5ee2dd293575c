"""Distribution shifts applied per client: concept label maps and image corruptions.

Concept shift is a permutation of the labels (FedRC App. H.8); feature shift is a corruption of
one kind and severity (FashionMNIST-C / CIFAR-10-C style) applied to all of a client's inputs.
Everything here is pure torch (no torchvision) so it runs with the CPU-only wheel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CORRUPTIONS", "corrupt", "label_map", "max_concepts"]


def max_concepts(num_classes: int) -> int:
    """Number of distinct label maps `label_map` offers for `num_classes` classes.

    The shifts y -> (y + s) mod C give C maps and the reversal y -> C-1-y one more, which is a
    shift only when C == 2.
    """
    _check_num_classes(num_classes)
    return 2 if num_classes == 2 else int(num_classes) + 1


def label_map(concept: int, num_classes: int) -> Tensor:
    """Permutation table of concept `concept`: the new label of class y is `table[y]`.

    Concept 0 is the identity, 1 is y -> C-1-y, 2 is y -> (y+1) mod C and c >= 3 is
    y -> (y+c-1) mod C, so concepts 0..max_concepts(C)-1 are pairwise distinct.
    """
    limit = max_concepts(num_classes)
    if isinstance(concept, bool) or not isinstance(concept, Integral) or not 0 <= concept < limit:
        raise ValueError(
            f"concept must be an integer in [0, {limit}) for num_classes={num_classes} "
            f"(only {limit} distinct label maps exist), got {concept!r}; use fewer concepts"
        )
    y = torch.arange(int(num_classes), dtype=torch.long)
    if concept == 0:
        return y
    if concept == 1:
        return num_classes - 1 - y
    return (y + int(concept) - 1) % num_classes


def _check_num_classes(num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, Integral) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")


# ---------------------------------------------------------------------------------------------
# Corruptions. Each takes images [N, C, H, W] in [0, 1], the severity parameter and a generator.
# Severity parameters are chosen so the mean absolute change grows with severity on 8x8 and
# 28x28 images alike (checked in tests/test_shifts.py).

_PARAMS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.04, 0.08, 0.12, 0.18, 0.26),  # noise std
    "shot_noise": (60.0, 25.0, 12.0, 5.0, 3.0),  # photons per unit intensity
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),  # share of pixels hit
    "gaussian_blur": (0.5, 0.75, 1.0, 1.5, 2.0),  # kernel std in pixels
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),  # added intensity
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),  # kept share of the deviation from the mean
    "rotate": (8.0, 16.0, 24.0, 32.0, 40.0),  # degrees, random sign
    "shear": (0.1, 0.2, 0.3, 0.4, 0.5),  # horizontal shear factor, random sign
    "scale": (0.9, 0.8, 0.7, 0.6, 0.5),  # zoom-out factor
    "translate": (0.06, 0.12, 0.18, 0.24, 0.3),  # shift as a share of the image size
    "pixelate": (0.8, 0.65, 0.5, 0.4, 0.3),  # downsampled size as a share of the original
    "elastic": (0.03, 0.06, 0.09, 0.12, 0.15),  # displacement amplitude as a share of the size
}


def _rand(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """Uniform [0, 1) noise drawn on the generator's device, moved to `like`'s device/dtype."""
    out = torch.rand(shape, generator=generator, device=generator.device)
    return out.to(device=like.device, dtype=like.dtype)


def _randn(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    out = torch.randn(shape, generator=generator, device=generator.device)
    return out.to(device=like.device, dtype=like.dtype)


def _random_sign(n: int, generator: torch.Generator, like: Tensor) -> Tensor:
    return torch.where(_rand((n,), generator, like) < 0.5, -1.0, 1.0).to(like.dtype)


def _gaussian_noise(x: Tensor, std: float, g: torch.Generator) -> Tensor:
    return x + std * _randn(tuple(x.shape), g, x)


def _shot_noise(x: Tensor, rate: float, g: torch.Generator) -> Tensor:
    counts = torch.poisson((x.clamp(0, 1) * rate).to(g.device), generator=g)
    return counts.to(device=x.device, dtype=x.dtype) / rate


def _impulse_noise(x: Tensor, amount: float, g: torch.Generator) -> Tensor:
    hit = _rand(tuple(x.shape), g, x) < amount
    salt = (_rand(tuple(x.shape), g, x) < 0.5).to(x.dtype)
    return torch.where(hit, salt, x)


def _gaussian_blur(x: Tensor, sigma: float, g: torch.Generator) -> Tensor:
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (t / sigma) ** 2)
    kernel = kernel / kernel.sum()
    channels = x.shape[1]
    horizontal = kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1)
    vertical = kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1)
    out = F.pad(x, (radius, radius, 0, 0), mode="replicate")
    out = F.conv2d(out, horizontal, groups=channels)
    out = F.pad(out, (0, 0, radius, radius), mode="replicate")
    return F.conv2d(out, vertical, groups=channels)


def _brightness(x: Tensor, amount: float, g: torch.Generator) -> Tensor:
    return x + amount


def _contrast(x: Tensor, keep: float, g: torch.Generator) -> Tensor:
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return mean + (x - mean) * keep


def _warp(x: Tensor, theta: Tensor) -> Tensor:
    """Resample x with affine maps theta [N, 2, 3] (output -> input, normalised coordinates)."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _identity_theta(x: Tensor) -> Tensor:
    eye = torch.eye(2, 3, device=x.device, dtype=x.dtype)
    return eye.unsqueeze(0).repeat(x.shape[0], 1, 1)


def _rotate(x: Tensor, degrees: float, g: torch.Generator) -> Tensor:
    height, width = x.shape[-2:]
    angle = math.radians(degrees) * _random_sign(x.shape[0], g, x)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = _identity_theta(x)
    # Rotation in pixel space, expressed in normalised coordinates (keeps the aspect ratio).
    theta[:, 0, 0] = cos
    theta[:, 0, 1] = -sin * height / width
    theta[:, 1, 0] = sin * width / height
    theta[:, 1, 1] = cos
    return _warp(x, theta)


def _shear(x: Tensor, factor: float, g: torch.Generator) -> Tensor:
    height, width = x.shape[-2:]
    theta = _identity_theta(x)
    theta[:, 0, 1] = factor * _random_sign(x.shape[0], g, x) * height / width
    return _warp(x, theta)


def _scale(x: Tensor, zoom: float, g: torch.Generator) -> Tensor:
    theta = _identity_theta(x) / zoom
    return _warp(x, theta)


def _translate(x: Tensor, share: float, g: torch.Generator) -> Tensor:
    direction = 2 * math.pi * _rand((x.shape[0],), g, x)
    theta = _identity_theta(x)
    theta[:, 0, 2] = 2 * share * torch.cos(direction)
    theta[:, 1, 2] = 2 * share * torch.sin(direction)
    return _warp(x, theta)


def _block_average(size: int, blocks: int, like: Tensor) -> Tensor:
    """[size, size] matrix averaging each of `blocks` contiguous, near-equal runs of pixels."""
    block_of = torch.arange(size, device=like.device) * blocks // size
    same = (block_of[:, None] == block_of[None, :]).to(like.dtype)
    return same / same.sum(dim=1, keepdim=True)


def _pixelate(x: Tensor, share: float, g: torch.Generator) -> Tensor:
    # Blocks are aligned with the pixels they average (unlike resize-down/resize-up, whose
    # misaligned blocks make the change non-monotone in the block count).
    height, width = x.shape[-2:]
    rows = _block_average(height, max(1, round(height * share)), x)
    cols = _block_average(width, max(1, round(width * share)), x)
    return rows @ x @ cols.T


def _elastic(x: Tensor, amplitude: float, g: torch.Generator) -> Tensor:
    n, _, height, width = x.shape
    # Smooth random displacement: coarse uniform noise upsampled bilinearly to full size.
    coarse = 2 * _rand((n, 2, 4, 4), g, x) - 1
    field = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=True)
    grid = F.affine_grid(_identity_theta(x), list(x.shape), align_corners=False)
    grid = grid + 2 * amplitude * field.permute(0, 2, 3, 1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


_FUNCTIONS: dict[str, Callable[[Tensor, float, torch.Generator], Tensor]] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "gaussian_blur": _gaussian_blur,
    "brightness": _brightness,
    "contrast": _contrast,
    "rotate": _rotate,
    "shear": _shear,
    "scale": _scale,
    "translate": _translate,
    "pixelate": _pixelate,
    "elastic": _elastic,
}

CORRUPTIONS: tuple[str, ...] = tuple(_FUNCTIONS)
"""Names accepted by `corrupt`, in a fixed order (scenario construction samples from it)."""


def corrupt(images: Tensor, kind: str, severity: int, generator: torch.Generator) -> Tensor:
    """Corrupt float images [N, C, H, W] in [0, 1] with `kind` at `severity` (1..5).

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
        raise ValueError(f"kind must be one of {', '.join(CORRUPTIONS)}; got {kind!r}")
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
