"""``VerifiedCheckpointIO``: the federated strategies' default ``CheckpointIO``.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temporary file lives
in the system's temporary directory: on another filesystem its final move is a copy, so a full
disk or a crash leaves a torn file under the checkpoint's name (or destroys the file it
replaces). This one writes local checkpoints beside their target (temporary file, fsync, rename:
``engine/verified_files.py``) with a content hash of everything in them, and checks the hash on
load, so a truncated or corrupted checkpoint is refused, naming it and the last good one beside
it, instead of resuming from wrong weights. Remote paths (``s3://`` ...) keep Lightning's way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.utilities import rank_zero_warn

from lightning_fedcluster.engine.verified_files import load_verified, save_verified

CheckpointPath = str | Path  # what Lightning passes a CheckpointIO as a path


def is_local(path: CheckpointPath) -> bool:
    return isinstance(get_filesystem(path), LocalFileSystem)


class VerifiedCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic local writes and a verified content hash."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: CheckpointPath, storage_options: Any = None
    ) -> None:
        if storage_options is not None or not is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        save_verified(checkpoint, path)

    def load_checkpoint(
        self,
        path: CheckpointPath,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if not is_local(path):
            return super().load_checkpoint(path, map_location, weights_only)
        if not get_filesystem(path).exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        checkpoint, verified = load_verified(
            path, lambda p: TorchCheckpointIO.load_checkpoint(self, p, map_location, weights_only)
        )
        if not verified:
            rank_zero_warn(
                f"{path} carries no content hash (written before lightning-fedcluster verified its "
                "checkpoints, or by another CheckpointIO): it is loaded without verification"
            )
        return checkpoint
