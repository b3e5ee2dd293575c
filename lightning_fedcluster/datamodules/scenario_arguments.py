"""The argument checks of ``build_scenario`` (``datamodules/scenario.py``): each returns the
checked value or raises naming the argument and the fix, before any client is built."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.datamodules.shifts import ALL_CORRUPTIONS, CORRUPTIONS
from lightning_fedcluster.datamodules.validation import check_channels_first, fraction_arg, is_int


def preset_evaluation_fractions(
    preset: str | None, test_fraction: float | None, adapt_fraction: float | None
) -> tuple[float, float]:
    """test_fraction and adapt_fraction left as None: the authors' 0.1 and 0.9 under
    preset="authors" (their loader splits every client, global ones too, 90 / 10), else 0.2 and 0.4."""
    authors = preset == "authors"
    test = (0.1 if authors else 0.2) if test_fraction is None else test_fraction
    adapt = (0.9 if authors else 0.4) if adapt_fraction is None else adapt_fraction
    return test, adapt


def preset_arg(
    preset: str | None,
    concepts: int,
    dirichlet_alpha: float | None,
    concept_proportions: Sequence[float] | None,
    corrupt_fraction: float | Sequence[float] | None,
) -> bool:
    """True for preset="authors" after checking that nothing given contradicts it."""
    if preset is None:
        return False
    if preset != "authors":
        raise ValueError(f"preset must be None or 'authors', got {preset!r}")
    if concepts != 3:
        raise ValueError(f"preset='authors' has three concepts; got concepts={concepts!r}, pass concepts=3")
    fixed = (("concept_proportions", concept_proportions), ("corrupt_fraction", corrupt_fraction))
    given = [name for name, value in fixed if value is not None]
    if given:
        raise ValueError(
            f"preset='authors' fixes the client types, so {' and '.join(given)} must be left unset (None)"
        )
    if dirichlet_alpha is None:
        raise ValueError(
            "preset='authors' draws label shares from Dir(dirichlet_alpha * p); pass a positive "
            "dirichlet_alpha (the authors use 1.0), not None"
        )
    return True


def corruptions_arg(value: Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return CORRUPTIONS
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(
            f"corruptions must be a non-empty list of corruption names, got {value!r}; e.g. shifts.CIFAR10_C"
        )
    unknown = [kind for kind in value if kind not in ALL_CORRUPTIONS]
    if unknown:
        raise ValueError(f"corruptions has unknown kinds {unknown}; choose from {', '.join(ALL_CORRUPTIONS)}")
    return tuple(value)


def check_tensors(x: Any, y: Any, name: str = "") -> tuple[Tensor, Tensor]:
    """Check labelled inputs; `name` prefixes the messages (e.g. "global_test")."""
    where = f"{name} " if name else ""
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        kinds = getattr(getattr(y, "dtype", None), "kind", "")  # a numpy array's: U/S strings, O objects
        if kinds in ("U", "S", "O"):
            raise TypeError(
                f"{where}y holds {y.dtype} labels (strings or objects), but labels must be integer-encoded "
                "class indices 0..C-1: classes, codes = numpy.unique(y, return_inverse=True), then pass "
                "torch.from_numpy(codes) (classes[i] names class i)"
            )
        numpy = (
            " (numpy arrays: torch.from_numpy(a))"
            if hasattr(x, "__array__") or hasattr(y, "__array__")
            else ""
        )
        raise TypeError(
            f"{where}x and y must be torch tensors, got ({type(x).__name__}, {type(y).__name__}){numpy}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{where}x must be floating point, got {x.dtype}; use x.float() (scaled to [0, 1])")
    if y.is_floating_point() and y.numel() and not bool(torch.equal(y, y.round())):
        raise TypeError(
            f"{where}y holds non-integer {y.dtype} values: regression targets? from_tensors builds the "
            "classification scenario (its concepts permute class labels) and y.long() would truncate them. "
            "For regression build the clients with FederatedDataModule.from_partition(x, y, parts) (float "
            "targets make a regression task) and train with a strategy other than FedRC, e.g. "
            "FedEMStrategy, and a model that predicts y (docs: algorithms, Regression)"
        )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(f"{where}y must hold integer class indices, got {y.dtype}; use y.long()")
    if x.ndim < 2:
        raise ValueError(
            f"{where}x must have shape [N, ...features], got {tuple(x.shape)}; use x.unsqueeze(1)"
        )
    if y.ndim != 1 or y.shape[0] != x.shape[0] or y.shape[0] == 0:
        raise ValueError(
            f"{where}y must be 1-D with one label per row of x ({x.shape[0]} rows, non-empty), got "
            f"shape {tuple(y.shape)}"
        )
    return x.detach().to("cpu", torch.float32), y.detach().to("cpu", torch.long)


def proportions_arg(value: Sequence[float] | None, concepts: int) -> list[float]:
    """Concept proportions; the default gives concept 0 half the clients (the paper's mix)."""
    if value is None:
        return [1.0] if concepts == 1 else [0.5] + [0.5 / (concepts - 1)] * (concepts - 1)
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != concepts:
        raise ValueError(
            f"concept_proportions must be a sequence of {concepts} numbers (one per concept), got {value!r}"
        )
    if any(isinstance(p, bool) or not isinstance(p, Real) or not p >= 0 for p in value):
        raise ValueError(f"concept_proportions must be non-negative numbers, got {value!r}")
    if not math.isclose(sum(value), 1.0, abs_tol=1e-6):
        raise ValueError(f"concept_proportions must sum to 1, got {value!r} (sum {sum(value):g})")
    return [float(p) for p in value]


def corrupt_fractions_arg(value: float | Sequence[float] | None, concepts: int) -> list[float]:
    """Share of corrupted clients per concept; the default is the paper's 0.4 then 0.2 each."""
    if value is None:
        return [0.4] + [0.2] * (concepts - 1)
    if isinstance(value, Real) and not isinstance(value, bool):
        return [fraction_arg("corrupt_fraction", value)] * concepts
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != concepts:
        raise ValueError(
            f"corrupt_fraction must be a number in [0, 1) or a sequence of {concepts} such "
            f"numbers (one per concept), got {value!r}"
        )
    return [fraction_arg("corrupt_fraction", f) for f in value]


def rows_as_images(x: Any, image_shape: Any) -> Any:
    """Flat rows [N, C*H*W] as the images [N, C, H, W] that ``image_shape`` names: what
    ``from_tensors`` serves, as ``fedcluster fit --data FILE`` does (``as_images``). Anything else
    is returned unchanged, for ``build_scenario``'s checks to name."""
    if (
        not isinstance(x, Tensor)
        or x.ndim != 2
        or not isinstance(image_shape, (tuple, list))
        or len(image_shape) != 3
        or not all(is_int(d) and d > 0 for d in image_shape)
        or math.prod(image_shape) != x.shape[1]
    ):
        return x
    return x.reshape(-1, *(int(d) for d in image_shape))


def image_shape_arg(image_shape: Any, x: Tensor, *, needed: bool) -> tuple[int, ...]:
    """Image shape (C, H, W) the corruptions see; required only when a client is corrupted."""
    if image_shape is None:
        check_channels_first(x, None)
        if x.ndim == 4:
            return tuple(x.shape[1:])
        if needed:
            raise ValueError(
                f"corrupted clients need image-shaped inputs but x has shape {tuple(x.shape)}: "
                "pass image_shape=(channels, height, width) or corrupt_fraction=0"
            )
        return ()
    if (
        not isinstance(image_shape, (tuple, list))
        or len(image_shape) != 3
        or not all(is_int(d) and d > 0 for d in image_shape)
    ):
        raise ValueError(
            f"image_shape must be (channels, height, width) positive integers, got {image_shape!r}"
        )
    per_sample = math.prod(x.shape[1:])
    if math.prod(image_shape) != per_sample:
        raise ValueError(
            f"image_shape={tuple(image_shape)} has {math.prod(image_shape)} values per sample "
            f"but x has per-sample shape {tuple(x.shape[1:])} ({per_sample} values); "
            "fix image_shape"
        )
    check_channels_first(x, tuple(int(d) for d in image_shape))
    return tuple(int(d) for d in image_shape)
