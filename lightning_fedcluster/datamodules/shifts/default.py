"""The default pool of image corruptions (`CORRUPTIONS`): noise, blur, colour and geometry.

Pure torch (no torchvision), so scenarios with feature shift run with the CPU-only wheel. Each
corruption takes images [N, C, H, W] in [0, 1], the severity parameter and a generator.
Severity parameters are chosen so the mean absolute change grows with severity on 8x8 and
28x28 images alike (checked in tests/datamodules/shifts/test_default.py). The noise, blur and warp helpers are
public because the rest of the corruption families (`shifts.extra`) build on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "CORRUPTIONS",
    "DEFAULT_FUNCTIONS",
    "DEFAULT_PARAMS",
    "gaussian_blur",
    "identity_theta",
    "normal_noise",
    "uniform_noise",
    "warp",
]

DEFAULT_PARAMS: dict[str, tuple[float, ...]] = {
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


def uniform_noise(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """Uniform [0, 1) noise drawn on the generator's device, moved to `like`'s device/dtype."""
    out = torch.rand(shape, generator=generator, device=generator.device)
    return out.to(device=like.device, dtype=like.dtype)


def normal_noise(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """Standard normal noise, drawn and moved like `uniform_noise`."""
    out = torch.randn(shape, generator=generator, device=generator.device)
    return out.to(device=like.device, dtype=like.dtype)


def _random_sign(n: int, generator: torch.Generator, like: Tensor) -> Tensor:
    return torch.where(uniform_noise((n,), generator, like) < 0.5, -1.0, 1.0).to(like.dtype)


def _gaussian_noise(x: Tensor, std: float, g: torch.Generator) -> Tensor:
    return x + std * normal_noise(tuple(x.shape), g, x)


def _shot_noise(x: Tensor, rate: float, g: torch.Generator) -> Tensor:
    counts = torch.poisson((x.clamp(0, 1) * rate).to(g.device), generator=g)
    return counts.to(device=x.device, dtype=x.dtype) / rate


def _impulse_noise(x: Tensor, amount: float, g: torch.Generator) -> Tensor:
    hit = uniform_noise(tuple(x.shape), g, x) < amount
    salt = (uniform_noise(tuple(x.shape), g, x) < 0.5).to(x.dtype)
    return torch.where(hit, salt, x)


def gaussian_blur(x: Tensor, sigma: float, g: torch.Generator) -> Tensor:
    """Separable Gaussian blur with kernel std `sigma` pixels (replicate padding); `g` is unused."""
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


def warp(x: Tensor, theta: Tensor) -> Tensor:
    """Resample x with affine maps theta [N, 2, 3] (output -> input, normalised coordinates)."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def identity_theta(x: Tensor) -> Tensor:
    """Identity affine maps [N, 2, 3] for `warp`, one per image of x."""
    eye = torch.eye(2, 3, device=x.device, dtype=x.dtype)
    return eye.unsqueeze(0).repeat(x.shape[0], 1, 1)


def _rotate(x: Tensor, degrees: float, g: torch.Generator) -> Tensor:
    height, width = x.shape[-2:]
    angle = math.radians(degrees) * _random_sign(x.shape[0], g, x)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = identity_theta(x)
    # Rotation in pixel space, expressed in normalised coordinates (keeps the aspect ratio).
    theta[:, 0, 0] = cos
    theta[:, 0, 1] = -sin * height / width
    theta[:, 1, 0] = sin * width / height
    theta[:, 1, 1] = cos
    return warp(x, theta)


def _shear(x: Tensor, factor: float, g: torch.Generator) -> Tensor:
    height, width = x.shape[-2:]
    theta = identity_theta(x)
    theta[:, 0, 1] = factor * _random_sign(x.shape[0], g, x) * height / width
    return warp(x, theta)


def _scale(x: Tensor, zoom: float, g: torch.Generator) -> Tensor:
    theta = identity_theta(x) / zoom
    return warp(x, theta)


def _translate(x: Tensor, share: float, g: torch.Generator) -> Tensor:
    direction = 2 * math.pi * uniform_noise((x.shape[0],), g, x)
    theta = identity_theta(x)
    theta[:, 0, 2] = 2 * share * torch.cos(direction)
    theta[:, 1, 2] = 2 * share * torch.sin(direction)
    return warp(x, theta)


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
    coarse = 2 * uniform_noise((n, 2, 4, 4), g, x) - 1
    field = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=True)
    grid = F.affine_grid(identity_theta(x), list(x.shape), align_corners=False)
    grid = grid + 2 * amplitude * field.permute(0, 2, 3, 1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


DEFAULT_FUNCTIONS: dict[str, Callable[[Tensor, float, torch.Generator], Tensor]] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "gaussian_blur": gaussian_blur,
    "brightness": _brightness,
    "contrast": _contrast,
    "rotate": _rotate,
    "shear": _shear,
    "scale": _scale,
    "translate": _translate,
    "pixelate": _pixelate,
    "elastic": _elastic,
}

CORRUPTIONS: tuple[str, ...] = tuple(DEFAULT_FUNCTIONS)
"""The default pool, in a fixed order (scenario construction samples from it); pure torch."""
