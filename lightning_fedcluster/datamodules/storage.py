"""How a FederatedDataModule stores its splits: every client's rows of one split concatenated
into (x, y, offsets), client views of them, and the names an evaluation stage reads."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.arguments import is_int
from lightning_fedcluster.datamodules.evaluation_splits import EVALUATION_PARTS, EVALUATION_STAGES

Split = tuple[Tensor, Tensor]


def concatenate(
    name: str,
    splits: list[Split],
    sample_shape: tuple[int, ...],
    target_shape: tuple[int, ...] = (),
    target_dtype: torch.dtype = torch.long,
) -> tuple[Tensor, Tensor, Tensor]:
    """Concatenate splits into (x, y, offsets) after checking every per-sample shape."""
    xs, ys = [], []
    for i, (x, y) in enumerate(splits):
        if tuple(x.shape[1:]) != sample_shape:
            if x.shape[0] != 0:
                raise ValueError(
                    f"{name}[{i}] inputs have per-sample shape {tuple(x.shape[1:])} but "
                    f"client_train[0] has {sample_shape}: all inputs must share one per-sample "
                    "shape"
                )
            x = x.reshape(0, *sample_shape)  # an empty split given as e.g. torch.empty(0)
        if tuple(y.shape[1:]) != target_shape:
            if y.shape[0] != 0:
                raise ValueError(
                    f"{name}[{i}] targets have per-sample shape {tuple(y.shape[1:])} but "
                    f"client_train[0] has {target_shape}: all targets must share one shape"
                )
            y = y.reshape(0, *target_shape)
        xs.append(x)
        ys.append(y)
    sizes = torch.tensor([0] + [x.shape[0] for x in xs], dtype=torch.long)
    offsets = sizes.cumsum(0)
    if not xs:
        empty_y = torch.empty((0, *target_shape), dtype=target_dtype)
        return torch.empty((0, *sample_shape)), empty_y, offsets
    return joined(xs), joined(ys), offsets


ROW_STORES: weakref.WeakSet[Tensor] = weakref.WeakSet()
"""Tensors whose slices the datamodule keeps as they are (``keep_slices``)."""


def keep_slices(tensor: Tensor) -> Tensor:
    """Let splits that are end-to-end slices of ``tensor`` be kept as a view of it rather than
    copied (``datamodules/client_store.py``'s rows, written for the datamodule); other tensors'
    slices are copied, so a datamodule never shares memory with its caller's tensors."""
    ROW_STORES.add(tensor)
    return tensor


def joined(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``, but parts that lie end to end in one ``keep_slices`` tensor give a
    view of it instead of a copy, so such splits (a memory-mapped file's rows) are never held twice."""
    filled = [p for p in parts if p.numel()]
    first = filled[0] if filled else parts[0]
    step = first.element_size()
    alike = all(p.dtype == first.dtype and p.device == first.device for p in parts)
    kept = {t.untyped_storage().data_ptr() for t in ROW_STORES}
    if (
        filled
        and alike
        and all(p.is_contiguous() for p in filled)
        and first.untyped_storage().data_ptr() in kept
    ):
        storage = first.untyped_storage()
        position = first.data_ptr()
        for part in filled:
            if part.untyped_storage().data_ptr() != storage.data_ptr() or part.data_ptr() != position:
                break
            position += part.numel() * step
        else:
            rows = sum(p.shape[0] for p in parts)
            return torch.empty(0, dtype=first.dtype, device=first.device).set_(
                storage, first.storage_offset(), (rows, *first.shape[1:]), first.stride()
            )
    return torch.cat(parts)


def check_stage_part(stage: Any, part: Any) -> None:
    """ValueError unless ``stage`` is "val"/"test" and ``part`` one of the evaluation parts."""
    if stage not in EVALUATION_STAGES:
        raise ValueError(f"stage must be 'val' or 'test', got {stage!r}")
    if part not in EVALUATION_PARTS:
        raise ValueError(f"part must be 'local', 'global_adapt' or 'global_score', got {part!r}")


def client_slice(x: Tensor, y: Tensor, offsets: Tensor, index: int, name: str, count: int) -> Split:
    """Client ``index``'s rows of a concatenated split (views); IndexError naming ``name``."""
    if not is_int(index) or not 0 <= index < count:
        raise IndexError(f"{name} must be an integer in [0, {count}), got {index!r}")
    start, stop = int(offsets[index]), int(offsets[index + 1])
    return x[start:stop], y[start:stop]
