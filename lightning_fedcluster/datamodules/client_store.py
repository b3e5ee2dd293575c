"""Where a scenario's clients are written as they are read, one client at a time: every client's
training rows end to end in one tensor, held in memory or memory-mapped from a file
(``torch.from_file``), and its held-out rows in another. The datamodule keeps views of them
(``storage.joined``), so no tensor of the whole data set is ever built and, memory-mapped, the
training rows stay on disk until a client trains on them."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from lightning_fedcluster.datamodules.storage import keep_slices
from lightning_fedcluster.datamodules.validation import Split

__all__ = ["ClientStore"]


class ClientStore:
    """Room for every client's (train, held-out) rows, sized in advance (``train_sizes``,
    ``test_sizes``: rows per client). ``place`` (a ``scenario_clients.Placement``) copies client
    i's rows into its slot and returns views of the slots. With ``memory_map`` (a directory), the
    training inputs go to ``train_x.f32`` there, memory-mapped; the rest stays in memory."""

    def __init__(
        self,
        train_sizes: list[int],
        test_sizes: list[int],
        sample_shape: tuple[int, ...],
        memory_map: str | Path | None = None,
        columns: object = "the inputs",
    ) -> None:
        self.columns = columns  # what the rows were read from, for messages
        self.sample_shape = tuple(sample_shape)
        self.train_offsets = _offsets(train_sizes)
        self.test_offsets = _offsets(test_sizes)
        rows = int(self.train_offsets[-1])
        self.path: Path | None = None
        if memory_map is None:
            self.train_x = torch.empty((rows, *self.sample_shape), dtype=torch.float32)
        else:
            directory = Path(memory_map)
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / "train_x.f32"
            self.path.unlink(missing_ok=True)  # a file of an earlier build: start from zero
            size = rows * math.prod(self.sample_shape)
            flat = torch.from_file(str(self.path), shared=True, size=size, dtype=torch.float32)
            self.train_x = flat.view(rows, *self.sample_shape)
        self.train_y = torch.empty(rows, dtype=torch.long)
        held = int(self.test_offsets[-1])
        self.test_x = torch.empty((held, *self.sample_shape), dtype=torch.float32)
        self.test_y = torch.empty(held, dtype=torch.long)
        for tensor in (self.train_x, self.train_y, self.test_x, self.test_y):
            keep_slices(tensor)  # the datamodule keeps views of these rows, not copies

    def place(self, i: int, train: Split, test: Split) -> tuple[Split, Split]:
        """Copy client i's rows into its slots; the slots (views) are what the datamodule keeps."""
        return (
            _put(self.train_x, self.train_y, self.train_offsets, i, train, self.columns),
            _put(self.test_x, self.test_y, self.test_offsets, i, test, self.columns),
        )


def _offsets(sizes: list[int]) -> list[int]:
    out = [0]
    for size in sizes:
        out.append(out[-1] + int(size))
    return out


def _put(x: Tensor, y: Tensor, offsets: list[int], i: int, split: Split, columns: object) -> Split:
    start, stop = offsets[i], offsets[i + 1]
    rows_x, rows_y = split
    if tuple(rows_x.shape[1:]) != tuple(x.shape[1:]):
        raise ValueError(
            f"client {i}'s inputs ({columns}) have per-sample shape {tuple(rows_x.shape[1:])} but the "
            f"first row's have {tuple(x.shape[1:])}: every row must have one shape (resize the images, "
            "or pad the arrays, to one size)"
        )
    x[start:stop] = rows_x
    y[start:stop] = rows_y
    return x[start:stop], y[start:stop]
