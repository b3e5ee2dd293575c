"""Input validation for `FederatedDataModule` and the scenario builders.

Argument checks (integers, fractions, batch size, number of classes, task), the cleaning of
(x, y) splits into float32 inputs with int64 labels or float32 targets, and the label-range and
NaN/Inf checks that name the offending split and client. Kept apart so every builder and
datamodule reports bad input with the same messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.arguments import fraction_arg, int_arg, is_int  # noqa: F401 - re-exported
from lightning_fedcluster.engine.task import Task

__all__ = [
    "TASKS",
    "Split",
    "check_batch_size",
    "check_channels_first",
    "check_finite_split",
    "check_labels",
    "check_num_classes_arg",
    "clean_splits",
    "fraction_arg",
    "int_arg",
    "is_int",
    "task_arg",
]

Split = tuple[Tensor, Tensor]


def check_batch_size(batch_size: Any) -> None:
    """Raise ValueError unless batch_size is an integer >= 1."""
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def check_num_classes_arg(num_classes: Any) -> None:
    """Raise ValueError unless num_classes is an integer >= 2."""
    if not is_int(num_classes) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2 (or None to infer it), got {num_classes!r}")


TASKS = tuple(task.value for task in Task)


def task_arg(task: Any, num_classes: Any, client_train: Any) -> Task:
    """The task (a ``Task``, converted here from the user's string): as given, else classification
    unless the first training targets are float."""
    if task is not None:
        if task not in TASKS:
            raise ValueError(f"task must be 'classification', 'regression' or None, got {task!r}")
        task = Task.of(task)
        if task is Task.REGRESSION and num_classes is not None:
            raise ValueError(
                f"num_classes={num_classes!r} was given for a regression task: pass num_classes=None "
                "(regression targets are float) or task='classification'"
            )
        return task
    if num_classes is not None:
        return Task.CLASSIFICATION
    try:
        first_y = client_train[0][1]
    except (TypeError, IndexError, KeyError):
        return Task.CLASSIFICATION  # malformed input: clean_splits reports it
    if isinstance(first_y, Tensor) and first_y.is_floating_point():
        return Task.REGRESSION
    return Task.CLASSIFICATION


def clean_splits(name: str, splits: Any, task: Task = Task.CLASSIFICATION) -> list[Split]:
    """Check a sequence of (x, y) pairs and return them as (float32 x, int64 labels) for
    classification or (float32 x, float32 targets [N] or [N, D]) for regression."""
    if isinstance(splits, (Tensor, str)) or not isinstance(splits, Sequence):
        raise TypeError(
            f"{name} must be a sequence of (x, y) tensor pairs, one per client, got {type(splits).__name__}"
        )
    cleaned = []
    for i, pair in enumerate(splits):
        where = f"{name}[{i}]"
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{where} must be an (x, y) pair of tensors, got {type(pair).__name__}; "
                f"{name} is a list with one (x, y) pair per client, e.g. [(x0, y0), (x1, y1)]"
            )
        x, y = pair
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise TypeError(f"{where} must hold torch tensors, got ({type(x).__name__}, {type(y).__name__})")
        if not x.is_floating_point():
            raise TypeError(f"{where} inputs must be floating point, got {x.dtype}; use x.float()")
        if task is Task.REGRESSION:
            if not y.is_floating_point():
                raise TypeError(
                    f"{where} targets must be floating point for a regression task, got {y.dtype}; "
                    "use y.float() (integer labels mean classification: pass num_classes)"
                )
            if y.ndim not in (1, 2):
                raise ValueError(
                    f"{where} regression targets must be [N] or [N, D], got shape {tuple(y.shape)}"
                )
        else:
            if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
                raise TypeError(
                    f"{where} labels must be integer class indices, got {y.dtype}; use y.long() "
                    "(float targets with num_classes=None make a regression task)"
                )
            if y.ndim != 1:
                raise ValueError(f"{where} labels must be 1-D [N], got shape {tuple(y.shape)}")
        if x.ndim == 0 or y.ndim == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"{where} has {x.shape[0] if x.ndim else 0} inputs but "
                f"{y.shape[0] if y.ndim else 0} labels: x and y need the same length"
            )
        target_dtype = torch.float32 if task is Task.REGRESSION else torch.long
        cleaned.append((x.to(torch.float32), y.to(target_dtype)))
    return cleaned


def check_labels(name: str, y: Tensor, offsets: Tensor, num_classes: int) -> None:
    """Raise ValueError naming the first client of split `name` with a label outside [0, C)."""
    bad = ((y < 0) | (y >= num_classes)).nonzero()
    if bad.numel():
        row = int(bad[0, 0])
        client = int(torch.searchsorted(offsets, torch.tensor(row), right=True)) - 1
        raise ValueError(
            f"{name}[{client}] has label {int(y[row])} outside [0, num_classes={num_classes}); "
            "labels must be class indices: remap them or pass a larger num_classes"
        )


def check_channels_first(x: Tensor, image_shape: tuple[int, ...] | None) -> None:
    """4-D images must be [N, C, H, W] (as torch's conv layers take them): raise, naming the
    permutation, for channels-last [N, H, W, C] images (e.g. from numpy, PIL or TensorFlow), which
    would otherwise pass a values-per-sample check and fail later inside the model's conv2d."""
    if x.ndim != 4:
        return
    got = tuple(x.shape[1:])
    looks_last = got[2] in (1, 3, 4) and got[0] not in (1, 3, 4)
    if image_shape is not None and got == tuple(image_shape) or image_shape is None and not looks_last:
        return
    c, h, w = image_shape if image_shape is not None else (got[2], got[0], got[1])
    given = "" if image_shape is None else f" with image_shape={tuple(image_shape)} (channels, height, width)"
    if got == (h, w, c):
        raise ValueError(
            f"x has shape {tuple(x.shape)}{given}: the images look channels-last [N, H, W, C]; permute "
            f"them to [N, C, H, W] with x.permute(0, 3, 1, 2) (shape [N, {c}, {h}, {w}])"
        )
    raise ValueError(
        f"x has per-sample shape {got} but image_shape={tuple(image_shape or ())}: 4-D inputs must be "
        "[N, channels, height, width] equal to image_shape; reshape x or fix image_shape"
    )


FINITE_CHECK_ROWS = 8192  # rows per isfinite pass: a whole-tensor pass held ~1.3x the data


def _non_finite_rows(t: Tensor) -> Tensor | None:
    """Bool [N] marking rows of a float tensor with any NaN/Inf; None if all finite or not float.
    Checked in chunks of rows, so the transient mask stays small for large splits."""
    if not t.is_floating_point() or t.shape[0] == 0:
        return None
    flat = t.reshape(t.shape[0], -1)
    starts = range(0, t.shape[0], FINITE_CHECK_ROWS)
    bad = torch.cat([~torch.isfinite(flat[i : i + FINITE_CHECK_ROWS]).all(dim=1) for i in starts])
    return bad.cpu() if bool(bad.any()) else None  # CPU like the offsets, for locating clients


def check_finite_split(name: str, x: Tensor, y: Tensor, offsets: Tensor) -> None:
    """Raise ValueError naming the split, the first offending client and its row count if x or
    (float) y hold NaN/Inf; cheap when clean (one isfinite pass per tensor)."""
    bad_x, bad_y = _non_finite_rows(x), _non_finite_rows(y)
    if bad_x is None and bad_y is None:
        return
    none = torch.zeros(x.shape[0], dtype=torch.bool)
    bad_x = none if bad_x is None else bad_x
    bad_y = none if bad_y is None else bad_y
    rows = (bad_x | bad_y).nonzero().flatten()
    clients = torch.searchsorted(offsets, rows, right=True) - 1
    client = int(clients[0])
    mine = rows[clients == client]
    parts = [label for label, bad in (("inputs x", bad_x), ("targets y", bad_y)) if bool(bad[mine].any())]
    others = ""
    count = int(clients.unique().numel())
    if count > 1:
        others = f" ({rows.numel()} such rows across {count} clients of {name})"
    raise ValueError(
        f"{name}[{client}] has {mine.numel()} of {int(offsets[client + 1] - offsets[client])} rows "
        f"with NaN or Inf in its {' and '.join(parts)} (first at row {int(mine[0] - offsets[client])})"
        f"{others}: clean or drop the rows before building the datamodule"
    )
