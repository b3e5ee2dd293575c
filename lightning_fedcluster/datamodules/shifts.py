"""Distribution shifts applied per client: concept label maps and image corruptions.

Concept shift is a permutation of the labels (FedRC App. H.8); feature shift is a corruption of
one kind and severity (FashionMNIST-C / CIFAR-10-C style) applied to all of a client's inputs.
The default pool `CORRUPTIONS` is pure torch (no torchvision) so it runs with the CPU-only
wheel. `FASHION_MNIST_C` and `CIFAR10_C` are the two papers' families; the CIFAR-10-C kinds that
torchvision implements (`TORCHVISION_CORRUPTIONS`: JPEG, elastic transform, saturation) use it,
imported when first applied (the `vision` extra).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ALL_CORRUPTIONS",
    "CIFAR10_C",
    "CORRUPTIONS",
    "FASHION_MNIST_C",
    "TORCHVISION_CORRUPTIONS",
    "corrupt",
    "label_map",
    "max_concepts",
]


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
"""The default pool, in a fixed order (scenario construction samples from it); pure torch."""

# ---------------------------------------------------------------------------------------------
# The rest of the FashionMNIST-C / CIFAR-10-C families. Pure torch unless listed in
# TORCHVISION_CORRUPTIONS. Severity parameters again grow the mean absolute change.

_PARAMS.update(
    {
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
    }
)


def _speckle_noise(x: Tensor, std: float, g: torch.Generator) -> Tensor:
    return x + x * std * _randn(tuple(x.shape), g, x)


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
    angle = math.pi * _rand((x.shape[0],), g, x).view(-1, 1, 1)
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
    out = _gaussian_blur(x, 0.6, g)
    offsets = ((2 * _rand((n, 2, height, width), g, x) - 1) * jitter).round()
    rows = (torch.arange(height, device=x.device).view(1, -1, 1) + offsets[:, 0].long()).clamp(0, height - 1)
    cols = (torch.arange(width, device=x.device).view(1, 1, -1) + offsets[:, 1].long()).clamp(0, width - 1)
    flat = (rows * width + cols).reshape(n, 1, -1).expand(-1, x.shape[1], -1)
    out = out.reshape(n, x.shape[1], -1).gather(2, flat).reshape(x.shape)
    return _gaussian_blur(out, 0.6, g)


def _zoom_blur(x: Tensor, largest: float, g: torch.Generator) -> Tensor:
    zooms = torch.linspace(1.0, largest, 6).tolist()
    return torch.stack([x] + [_warp(x, _identity_theta(x) / z) for z in zooms[1:]]).mean(dim=0)


def _fog(x: Tensor, strength: float, g: torch.Generator) -> Tensor:
    # Smooth multi-scale noise ("plasma"), then the CIFAR-10-C mixing rule that keeps the range.
    n, _, height, width = x.shape
    fog = torch.zeros(n, 1, height, width, device=x.device, dtype=x.dtype)
    for octave, cells in enumerate((2, 4, 8)):
        coarse = _rand((n, 1, cells, cells), g, x)
        layer = F.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=True)
        fog = fog + 0.5**octave * layer
    low = fog.amin(dim=(2, 3), keepdim=True)
    fog = (fog - low) / (fog.amax(dim=(2, 3), keepdim=True) - low).clamp_min(1e-6)
    top = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + strength * fog) * top / (top + strength)


def _inverse(x: Tensor, weight: float, g: torch.Generator) -> Tensor:
    return (1 - weight) * x + weight * (1 - x)


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
    noise = 2 * _rand((n, 2, height, width), g, x) - 1
    field = _gaussian_blur(noise, max(1.0, 0.12 * min(height, width)), g)
    field = field / field.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6) * 2 * std
    field = field.permute(0, 2, 3, 1)
    return torch.cat([functional.elastic(x[i : i + 1], field[i : i + 1]) for i in range(n)])


_FUNCTIONS.update(
    {
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
    }
)

ALL_CORRUPTIONS: tuple[str, ...] = tuple(_FUNCTIONS)
"""Every name `corrupt` accepts."""

TORCHVISION_CORRUPTIONS: tuple[str, ...] = ("saturate", "jpeg_compression", "elastic_transform")
"""Kinds built on torchvision transforms (need the `vision` extra)."""

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
