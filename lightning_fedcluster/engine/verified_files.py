"""Checkpoint files that are never torn and never silently wrong.

``save_verified`` writes a dict with ``torch.save`` together with a content hash of everything
in it (every tensor's dtype, shape and bytes, and the plain values), atomically: into a temporary
file beside the target (the same filesystem), flushed and fsynced, then renamed over the target,
so a crash or a full disk leaves the previous file whole. ``load_verified`` reads one back and
refuses, naming the file and the last good one beside it, a file that is truncated, unreadable,
or whose contents no longer match its hash (a changed byte on disk). The Lightning checkpoints
(``strategies/checkpoint_io.py``) and the Flower server's run files use them.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

HASH_KEY = "fedcluster_content_hash"
HASH_NAME = "sha256"
_PLAIN = (int, float, complex, bool, str, bytes, type(None), enum.Enum, torch.dtype, torch.device, torch.Size)
# What torch.load raises on a truncated or garbled file.
_UNREADABLE = (EOFError, RuntimeError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile)


class CorruptCheckpointError(ValueError):
    """A checkpoint file that is truncated, unreadable or does not match its content hash."""


def content_hash(value: Any) -> str:
    """A hash of ``value``'s contents: tensors by dtype, shape and bytes, plain values by repr,
    containers in order (sets sorted), other objects by their type only (their repr may hold a
    memory address). The entry ``HASH_KEY`` of a dict is left out."""
    digest = hashlib.new(HASH_NAME)
    _feed(digest, value)
    return f"{HASH_NAME}:{digest.hexdigest()}"


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(b"{")
        for key, item in value.items():
            if key == HASH_KEY:
                continue
            _feed(digest, key)
            _feed(digest, item)
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[" if isinstance(value, list) else b"(")
        for item in value:
            _feed(digest, item)
        digest.update(b"]")
    elif isinstance(value, (set, frozenset)):
        digest.update(repr(sorted(repr(v) for v in value)).encode())
    elif isinstance(value, _PLAIN):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        digest.update(f"<{type(value).__qualname__}>".encode())


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it and rename it over
    ``path`` (then fsync the directory): ``path`` holds either its old contents or the whole new
    file, never a part. A failure (a full disk) removes the temporary file and names ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    recording = _RecordingFile(os.fdopen(handle, "wb"), temporary)
    try:
        with recording.file:
            write(recording)
            recording.file.flush()
            os.fsync(recording.file.fileno())
        os.replace(temporary, target)
    except BaseException as raised:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        error = recording.error or raised  # torch.save reports a failed write as "unexpected pos"
        if isinstance(error, OSError):
            kept = "the file that was there is unchanged" if target.exists() else "nothing was written there"
            raise OSError(
                error.errno, f"could not write {target} ({error.strerror or error}); {kept}"
            ) from error
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash once the directory is synced
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class _RecordingFile:
    """A binary file whose first failed write is kept (``torch.save`` replaces it by its own error)."""

    def __init__(self, file: Any, name: str) -> None:
        self.file, self.name, self.error = file, name, None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.file.flush()


def save_verified(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """``checkpoint`` with its content hash (``HASH_KEY``), written atomically to ``path``."""
    checkpoint[HASH_KEY] = content_hash(checkpoint)
    atomic_write(path, lambda file: torch.save(checkpoint, file))


def verify(checkpoint: Any, path: str | os.PathLike) -> bool:
    """Whether ``checkpoint`` (read from ``path``) matches the hash written with it; False for a
    file written without one. Raises ``CorruptCheckpointError`` on a mismatch."""
    saved = checkpoint.get(HASH_KEY) if isinstance(checkpoint, dict) else None
    if saved is None:
        return False
    if content_hash(checkpoint) != saved:
        raise CorruptCheckpointError(
            f"{path} is corrupted: its contents do not match the content hash written with it (a byte "
            f"changed on disk), so it is refused.{last_good_note(path)}"
        )
    return True


def load_verified(
    path: str | os.PathLike, load: Callable[[str | os.PathLike], Any] | None = None
) -> tuple[Any, bool]:
    """The checkpoint at ``path`` (``load``: how to read it, ``torch.load`` on the CPU by default)
    and whether it carried a content hash; a truncated or unreadable file, or one whose contents
    no longer match its hash, raises ``CorruptCheckpointError`` naming it and the last good one."""
    read = load or (lambda p: torch.load(p, map_location="cpu", weights_only=True))
    try:
        checkpoint = read(path)
    except FileNotFoundError:
        raise
    except _UNREADABLE as error:
        raise CorruptCheckpointError(
            f"{path} cannot be read as a checkpoint ({type(error).__name__}: {error}): it is truncated "
            "(a crash or a full disk while it was written elsewhere) or not a checkpoint."
            + last_good_note(path)
        ) from error
    return checkpoint, verify(checkpoint, path)


def last_good_note(path: str | os.PathLike, candidates: int = 5) -> str:
    """ " The last good checkpoint beside it is ...", naming the newest file with the same suffix
    in the same directory that reads and verifies (of the ``candidates`` newest), or saying there
    is none."""
    target = Path(path)
    try:
        siblings = sorted(
            (
                p
                for p in target.parent.glob(f"*{target.suffix}")
                if p.is_file() and p.resolve() != target.resolve()
            ),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
    except OSError:
        return ""
    for sibling in siblings[:candidates]:
        try:
            checkpoint = torch.load(sibling, map_location="cpu", weights_only=True)
            if verify(checkpoint, sibling):
                return f" The last good checkpoint beside it is {sibling}: use that one."
        except Exception:  # noqa: BLE001 - any unreadable sibling is simply not a good one
            continue
    return f" No verified checkpoint is beside it in {target.parent}."
