"""The rest of the FashionMNIST-C / CIFAR-10-C corruption families, beyond the default pool.

Speckle noise, motion/defocus/glass/zoom blur, fog, inverse, the FedRC authors' severity-free
`identity` and `stripe` (`SEVERITY_FREE`), and the kinds built on torchvision
(`TORCHVISION_CORRUPTIONS`: saturation, JPEG, elastic transform), which import it when first
applied (the `vision` extra). Same signature as the default pool; severity parameters again
grow the mean absolute change.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedcluster.datamodules.shifts.default import (
    gaussian_blur,
    identity_theta,
    normal_noise,
    uniform_noise,
    warp,
)

__all__ = ["EXTRA_FUNCTIONS", "EXTRA_PARAMS", "SEVERITY_FREE", "TORCHVISION_CORRUPTIONS"]

EXTRA_PARAMS: dict[str, tuple[float, ...]] = {
    "speckle_noise": (0.1, 0.18, 0.26, 0.36, 0.5),  # multiplicative noise std
    "motion_blur": (1.0, 1.5, 2.0, 3.0, 4.0),  # half length of the blur streak in pixels
    "defocus_blur": (0.75, 1.0, 1.5, 2.0, 2.5),  # disk radius in pixels
    "glass_blur": (0.5, 1.0, 1.5, 2.0, 3.0),  # pixel jitter radius (blur std 0.6 before/after)
    "zoom_blur": (1.06, 1.12, 1.18, 1.25, 1.33),  # largest zoom averaged in
    "fog": (0.15, 0.3, 0.45, 0.65, 0.9),  # fog strength
    "inverse": (0.2, 0.4, 0.6, 0.8, 1.0),  # blend weight of the inverted image
    "saturate": (1.5, 2.0, 3.0, 4.5, 6.0),  # saturation factor (colour images)
    "jpeg_compression": (80.0, 65.0, 58.0, 50.0, 40.0),  # JPEG quality
    "elastic_transform": (0.01, 0.02, 0.03, 0.045, 0.06),  # displacement std, share of size
    "identity": (0.0,) * 5,  # severity-free (see SEVERITY_FREE)
    "stripe": (0.0,) * 5,
}

SEVERITY_FREE: tuple[str, ...] = ("identity", "stripe")
"""Kinds of the FedRC authors' FashionMNIST-C pool whose severity changes nothing: `identity`
(a "corrupted" client left clean) and `stripe` (the outer quarter of columns on each side
inverted)."""


def _speckle_noise(x: Tensor, std: float, g: torch.Generator) -> Tensor:
    return x + x * std * normal_noise(tuple(x.shape), g, x)


def _filter_per_sample(x: Tensor, kernels: Tensor) -> Tensor:
    """Convolve each image with its own [k, k] kernel (odd k, replicate padding)."""
    n, channels, height, width = x.shape
    radius = kernels.shape[-1] // 2
    weight = kernels.repeat_interleave(channels, dim=0).unsqueeze(1)  # [N*C, 1, k, k]
    padded = F.pad(x.reshape(1, n * channels, height, width), (radius,) * 4, mode="replicate")
    return F.conv2d(padded, weight, groups=n * channels).reshape(n, channels, height, width)


def _motion_blur(x: Tensor, half_length: float, g: torch.Generator) -> Tensor:
    # An anti-aliased line segment of the given half length through the centre, random angle.
    radius = math.ceil(half_length)
    t = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    dy, dx = torch.meshgrid(t, t, indexing="ij")
    angle = math.pi * uniform_noise((x.shape[0],), g, x).view(-1, 1, 1)
    along = dx * torch.cos(angle) + dy * torch.sin(angle)
    across = (-dx * torch.sin(angle) + dy * torch.cos(angle)).abs()
    kernel = (1 - across).clamp_min(0) * (half_length + 0.5 - along.abs()).clamp(0, 1)
    return _filter_per_sample(x, kernel / kernel.sum(dim=(1, 2), keepdim=True))


def _defocus_blur(x: Tensor, radius: float, g: torch.Generator) -> Tensor:
    size = math.ceil(radius)
    t = torch.arange(-size, size + 1, device=x.device, dtype=x.dtype)
    dy, dx = torch.meshgrid(t, t, indexing="ij")
    disk = (radius + 0.5 - torch.sqrt(dx**2 + dy**2)).clamp(0, 1)
    kernel = (disk / disk.sum()).expand(x.shape[0], -1, -1)
    return _filter_per_sample(x, kernel)


def _glass_blur(x: Tensor, jitter: float, g: torch.Generator) -> Tensor:
    # Blur, move every pixel to a random place within `jitter` pixels, blur again.
    n, _, height, width = x.shape
    out = gaussian_blur(x, 0.6, g)
    offsets = ((2 * uniform_noise((n, 2, height, width), g, x) - 1) * jitter).round()
    rows = (torch.arange(height, device=x.device).view(1, -1, 1) + offsets[:, 0].long()).clamp(0, height - 1)
    cols = (torch.arange(width, device=x.device).view(1, 1, -1) + offsets[:, 1].long()).clamp(0, width - 1)
    flat = (rows * width + cols).reshape(n, 1, -1).expand(-1, x.shape[1], -1)
    out = out.reshape(n, x.shape[1], -1).gather(2, flat).reshape(x.shape)
    return gaussian_blur(out, 0.6, g)


def _zoom_blur(x: Tensor, largest: float, g: torch.Generator) -> Tensor:
    zooms = torch.linspace(1.0, largest, 6).tolist()
    return torch.stack([x] + [warp(x, identity_theta(x) / z) for z in zooms[1:]]).mean(dim=0)


def _fog(x: Tensor, strength: float, g: torch.Generator) -> Tensor:
    # Smooth multi-scale noise ("plasma"), then the CIFAR-10-C mixing rule that keeps the range.
    n, _, height, width = x.shape
    fog = torch.zeros(n, 1, height, width, device=x.device, dtype=x.dtype)
    for octave, cells in enumerate((2, 4, 8)):
        coarse = uniform_noise((n, 1, cells, cells), g, x)
        layer = F.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=True)
        fog = fog + 0.5**octave * layer
    low = fog.amin(dim=(2, 3), keepdim=True)
    fog = (fog - low) / (fog.amax(dim=(2, 3), keepdim=True) - low).clamp_min(1e-6)
    top = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + strength * fog) * top / (top + strength)


def _inverse(x: Tensor, weight: float, g: torch.Generator) -> Tensor:
    return (1 - weight) * x + weight * (1 - x)


def _identity(x: Tensor, unused: float, g: torch.Generator) -> Tensor:
    return x.clone()


def _stripe(x: Tensor, unused: float, g: torch.Generator) -> Tensor:
    width = x.shape[-1]
    edge = width // 4  # the authors invert columns [0, 7) and [21, 28) of 28
    out = x.clone()
    out[..., :edge] = 1 - out[..., :edge]
    out[..., width - edge :] = 1 - out[..., width - edge :]
    return out


def _torchvision(kind: str):  # type: ignore[no-untyped-def]
    """torchvision, with `io` and `transforms.v2.functional` loaded (submodules load lazily)."""
    try:
        import torchvision
        import torchvision.io
        import torchvision.transforms.v2.functional
    except ImportError as error:  # pragma: no cover - exercised only without torchvision
        raise ImportError(
            f"the corruption {kind!r} is built on torchvision, which is not installed: install the "
            "vision extra (pip install 'lightning-fedcluster[vision]') or pick a pure-torch kind "
            "from shifts.CORRUPTIONS"
        ) from error
    return torchvision


def _saturate(x: Tensor, factor: float, g: torch.Generator) -> Tensor:
    if x.shape[1] != 3:
        raise ValueError(
            f"saturate needs colour images [N, 3, H, W], got {x.shape[1]} channel(s); use another kind"
        )
    functional = _torchvision("saturate").transforms.v2.functional
    return functional.adjust_saturation(x.clamp(0, 1), factor)


def _jpeg_compression(x: Tensor, quality: float, g: torch.Generator) -> Tensor:
    import warnings

    io = _torchvision("jpeg_compression").io
    channels = x.shape[1]
    if channels not in (1, 3):
        raise ValueError(f"jpeg_compression needs 1 or 3 channels, got {channels}")
    images = (x.clamp(0, 1) * 255).round().to(device="cpu", dtype=torch.uint8)
    with warnings.catch_warnings():  # torchvision >= 0.29 marks its JPEG codec as deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        encoded = [io.encode_jpeg(image, quality=int(quality)) for image in images]
        decoded = [io.decode_jpeg(data, mode=io.ImageReadMode.UNCHANGED) for data in encoded]
    return torch.stack(decoded).to(device=x.device, dtype=x.dtype) / 255


def _elastic_transform(x: Tensor, std: float, g: torch.Generator) -> Tensor:
    functional = _torchvision("elastic_transform").transforms.v2.functional
    n, _, height, width = x.shape
    # Smooth random displacement (Gaussian-filtered uniform noise), rescaled to the wanted std in
    # normalised coordinates ([-1, 1] spans the image, so 2 * share of the size).
    noise = 2 * uniform_noise((n, 2, height, width), g, x) - 1
    field = gaussian_blur(noise, max(1.0, 0.12 * min(height, width)), g)
    field = field / field.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6) * 2 * std
    field = field.permute(0, 2, 3, 1)
    return torch.cat([functional.elastic(x[i : i + 1], field[i : i + 1]) for i in range(n)])


EXTRA_FUNCTIONS: dict[str, Callable[[Tensor, float, torch.Generator], Tensor]] = {
    "speckle_noise": _speckle_noise,
    "motion_blur": _motion_blur,
    "defocus_blur": _defocus_blur,
    "glass_blur": _glass_blur,
    "zoom_blur": _zoom_blur,
    "fog": _fog,
    "inverse": _inverse,
    "saturate": _saturate,
    "jpeg_compression": _jpeg_compression,
    "elastic_transform": _elastic_transform,
    "identity": _identity,
    "stripe": _stripe,
}

TORCHVISION_CORRUPTIONS: tuple[str, ...] = ("saturate", "jpeg_compression", "elastic_transform")
"""Kinds built on torchvision transforms (need the `vision` extra)."""
