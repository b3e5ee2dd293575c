"""The persistent optimizer-state store kept in a file (``optimizer_state_dir``), not in memory.

``optimizer_state="persist"`` keeps one flat vector per client; for 25 clients × K = 3 × 2.17 M
parameters that is ~650 MB of RAM held for the whole run, while a round on one process needs one
client's vector at a time. ``OptimizerStateFile`` keeps the vectors in an unnamed temporary file
in a directory the user chooses: a client's vector is read when its turn starts and written back
when it ends, so the process holds one vector, and the operating system's page cache (which it
can evict) holds the rest. The file is deleted when the store is closed or the process ends.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import IO, Any

import torch
from torch import Tensor


class OptimizerStateFile(MutableMapping[int, Tensor]):
    """{client: flat state vector in ``dtype``}, stored in a temporary file under ``directory``.

    Every vector has the same length, fixed by the first one written. Reading gives a fresh
    tensor (changing it does not change the store): write a vector back with ``store[key] = v``.
    """

    def __init__(self, directory: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> None:
        self.directory = Path(directory)
        self.dtype = dtype
        self._file: IO[bytes] = tempfile.TemporaryFile(
            prefix="fedcluster-optimizer-state-", dir=self.directory
        )
        self._slots: dict[int, int] = {}  # client -> position of its vector in the file
        self._next_slot = 0
        self._numel: int | None = None

    @property
    def vector_bytes(self) -> int:
        return 0 if self._numel is None else self._numel * self.dtype.itemsize

    def __getitem__(self, key: int) -> Tensor:
        slot = self._slots[key]
        raw = torch.empty(self.vector_bytes, dtype=torch.uint8)
        self._file.seek(slot * self.vector_bytes)
        if self._file.readinto(raw.numpy()) != self.vector_bytes:
            raise OSError(f"the optimizer-state file under {self.directory} was cut short")
        return raw.view(self.dtype)

    def __setitem__(self, key: int, vector: Tensor) -> None:
        flat = vector.detach().flatten().to("cpu", dtype=self.dtype).contiguous()
        if self._numel is None:
            self._numel = flat.numel()
        if flat.numel() != self._numel:
            raise ValueError(f"every stored state vector has {self._numel} values, got {flat.numel()}")
        slot = self._slots.get(int(key))
        if slot is None:
            slot = self._slots[int(key)] = self._next_slot
            self._next_slot += 1
        self._file.seek(slot * self.vector_bytes)
        self._file.write(flat.view(torch.uint8).numpy().data)
        self._file.flush()

    def __delitem__(self, key: int) -> None:
        # The slot stays allocated in the file; only the key is forgotten.
        del self._slots[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def clear(self) -> None:
        self._slots.clear()
        self._next_slot = 0
        self._numel = None
        self._file.truncate(0)

    def close(self) -> None:
        self._file.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> OptimizerStateFile:
        """A second store with the same contents in its own file (a copied module owns its state)."""
        copied = OptimizerStateFile(self.directory, self.dtype)
        for key in self:
            copied[key] = self[key]
        return copied

    def __repr__(self) -> str:
        return f"OptimizerStateFile({str(self.directory)!r}, {self.dtype}, {len(self)} clients)"


def check_state_directory(directory: str | os.PathLike[str] | None, optimizer_state: str) -> None:
    """``optimizer_state_dir``: only with ``optimizer_state="persist"``, an existing writable directory."""
    if directory is None:
        return
    if optimizer_state != "persist":
        raise ValueError(
            f"optimizer_state_dir={str(directory)!r} holds the store of optimizer_state='persist'; with "
            f"optimizer_state={optimizer_state!r} nothing is stored: give optimizer_state='persist' or drop "
            "optimizer_state_dir"
        )
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(f"optimizer_state_dir must be a directory path, got {type(directory).__name__}")
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(
            f"optimizer_state_dir={str(directory)!r} is not a directory: create it first (on a disk, "
            "not a tmpfs, so that the store leaves RAM)"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(
            f"optimizer_state_dir={str(directory)!r} is not writable: choose a directory you can write to"
        )
