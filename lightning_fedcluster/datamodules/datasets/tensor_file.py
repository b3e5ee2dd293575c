"""``TensorFileFederated``: the FedRC scenario from a user's ``.pt`` or ``.npz`` file of (x, y).

What ``fedcluster fit --data my_data.pt`` builds: the file's tensors go through the same steps as
``FederatedDataModule.from_tensors`` (label skew, concepts, corruptions, splits, global test
clients), with its arguments as the datamodule's flags, so one's own data needs no subclass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.arguments import is_int
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.scenario import build_scenario
from lightning_fedcluster.datamodules.scenario_arguments import preset_evaluation_fractions
from lightning_fedcluster.datamodules.validation import check_batch_size

__all__ = ["TENSOR_FILE_SUFFIXES", "TensorFileFederated", "load_tensor_file"]

TENSOR_FILE_SUFFIXES = (".pt", ".npz")
"""The file types ``TensorFileFederated`` reads (and ``fedcluster fit --data FILE`` recognises)."""
KEYS = ("x", "y", "x_test", "y_test")


class TensorFileFederated(FederatedDataModule):
    """The FedRC scenario built from labelled tensors stored in a file.

    The file holds ``x`` (inputs, float in [0, 1], or uint8 which is divided by 255) and ``y``
    (integer class indices 0..C-1), and optionally ``x_test`` / ``y_test``, a separate clean test
    set for the global test clients (then all of x, y goes to the clients). A ``.pt`` file is a
    dict with these keys (``torch.save({"x": x, "y": y}, path)``) or an ``(x, y)`` pair; an
    ``.npz`` file has arrays under these names (``numpy.savez(path, x=x, y=y)``).

    Every other argument is ``FederatedDataModule.from_tensors``'s, with its meaning.

    Args:
        path: the ``.pt`` or ``.npz`` file.
        num_clients: participating clients.
        concepts: concepts (label maps); clients are split among them by ``concept_proportions``.
        dirichlet_alpha: label skew Dir(alpha) over the clients (None: an IID split).
        corrupt_fraction: share of each concept's clients whose inputs are corrupted (needs images).
        concept_proportions: share of the clients per concept (default: half in concept 0).
        test_fraction: each client's held-out share (validation + test); default 0.2, 0.1 under
            preset="authors".
        global_test_fraction: share of every class held out for the global test clients
            (default 0.2; leave None when the file has x_test / y_test).
        min_client_size: fewest training rows a client may get.
        num_classes: classes (default: the largest label + 1).
        image_shape: (channels, height, width) of each input: flat rows [N, C*H*W] are reshaped to
            images [N, C, H, W] for convolutional models, e.g. ``[1, 8, 8]``; also what the
            corruptions see. None keeps x as stored.
        channels_last: x is stored as [N, H, W, C] images; they are served as [N, C, H, W].
        batch_size: rows per batch of a client's local steps.
        seed: every random draw of the scenario.
        corruptions: the pool of corruption kinds (default ``shifts.CORRUPTIONS``).
        val_share: share of each client's held-out rows used for validation (the rest: test).
        adapt_fraction: share of a global client's rows its mixture weights are fitted on;
            default 0.4, 0.9 under preset="authors".
        preset: "authors" for the client mix of the FedRC authors' scripts.
    """

    def __init__(
        self,
        path: str,
        num_clients: int = 30,
        concepts: int = 1,
        dirichlet_alpha: float | None = 1.0,
        corrupt_fraction: float | Sequence[float] | None = None,
        concept_proportions: Sequence[float] | None = None,
        test_fraction: float | None = None,
        global_test_fraction: float | None = None,
        min_client_size: int = 2,
        num_classes: int | None = None,
        image_shape: tuple[int, int, int] | None = None,
        channels_last: bool = False,
        batch_size: int = 32,
        seed: int = 0,
        corruptions: Sequence[str] | None = None,
        val_share: float = 0.5,
        adapt_fraction: float | None = None,
        preset: str | None = None,
    ) -> None:
        check_batch_size(batch_size)
        test_fraction, adapt_fraction = preset_evaluation_fractions(preset, test_fraction, adapt_fraction)
        tensors = load_tensor_file(path)
        x = as_images(tensors["x"], image_shape, channels_last, "x")
        global_test = None
        if "x_test" in tensors:
            x_test = as_images(tensors["x_test"], image_shape, channels_last, "x_test")
            global_test = (x_test, tensors["y_test"])
        arguments = build_scenario(
            x,
            tensors["y"],
            num_clients=num_clients,
            concepts=concepts,
            dirichlet_alpha=dirichlet_alpha,
            corrupt_fraction=corrupt_fraction,
            concept_proportions=concept_proportions,
            test_fraction=test_fraction,
            global_test_fraction=global_test_fraction,
            min_client_size=min_client_size,
            num_classes=num_classes,
            image_shape=image_shape,
            seed=seed,
            global_test=global_test,
            corruptions=corruptions,
            preset=preset,
        )
        super().__init__(
            **arguments, batch_size=batch_size, val_share=val_share, adapt_fraction=adapt_fraction, seed=seed
        )
        self.save_hyperparameters()


def load_tensor_file(path: str | Path) -> dict[str, Tensor]:
    """The tensors ``x``, ``y`` (and ``x_test``, ``y_test`` when present) of a ``.pt`` / ``.npz``
    file, as torch tensors; uint8 inputs are scaled to [0, 1]. Errors name the file and the fix."""
    path = Path(path)
    if path.suffix.lower() not in TENSOR_FILE_SUFFIXES:
        raise ValueError(f"path={str(path)!r}: expected a .pt or .npz file of (x, y) tensors")
    if not path.is_file():
        raise FileNotFoundError(f"path={str(path)!r}: no such file")
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as arrays:
            found = list(arrays.files)
            for key in (k for k in found if k in KEYS and arrays[k].dtype.kind in "USO"):
                raise ValueError(
                    f"{path}: {key!r} holds {arrays[key].dtype} values (strings), but labels must be "
                    "integer-encoded class indices 0..C-1: classes, codes = numpy.unique(labels, "
                    f"return_inverse=True), then save codes as {key!r}"
                )
            stored: dict[str, Any] = {k: torch.from_numpy(arrays[k]) for k in found if k in KEYS}
    else:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(loaded, (tuple, list)) and len(loaded) == 2:
            loaded = {"x": loaded[0], "y": loaded[1]}
        if not isinstance(loaded, dict):
            raise ValueError(
                f"{path}: a .pt file must hold a dict with keys 'x' and 'y' or an (x, y) pair, got "
                f"{type(loaded).__name__}; save it with torch.save({{'x': x, 'y': y}}, path)"
            )
        found = [str(k) for k in loaded]
        stored = {k: v for k, v in loaded.items() if k in KEYS}
    missing = [k for k in ("x", "y") if k not in stored]
    if missing or (("x_test" in stored) != ("y_test" in stored)):
        save = "numpy.savez(path, x=..., y=...)" if path.suffix.lower() == ".npz" else "torch.save"
        raise ValueError(
            f"{path}: needs tensors 'x' and 'y' (and optionally both 'x_test' and 'y_test'), but the file "
            f"holds {sorted(found)}: save the inputs as 'x' and the labels as 'y' ({save}"
            + ("({'x': ..., 'y': ...}, path)" if save == "torch.save" else "")
            + ")"
        )
    for key, value in stored.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"{path}: {key!r} must be a tensor or array, got {type(value).__name__}")
    return {k: v.float() / 255.0 if v.dtype == torch.uint8 else v for k, v in stored.items()}


def as_images(x: Tensor, image_shape: Sequence[int] | None, channels_last: bool, name: str) -> Tensor:
    """``x`` with each sample shaped ``image_shape`` (C, H, W): flat rows are reshaped and
    channels-last images permuted (``channels_last``); a mismatch is an error naming the fix."""
    if channels_last:
        if x.ndim != 4:
            raise ValueError(
                f"channels_last=True needs {name} stored as [N, H, W, C] images, got shape {tuple(x.shape)}"
            )
        x = x.permute(0, 3, 1, 2).contiguous()
    if image_shape is None:
        return x
    if (
        not isinstance(image_shape, (tuple, list))
        or len(image_shape) != 3
        or not all(is_int(d) and d > 0 for d in image_shape)
    ):
        raise ValueError(
            "image_shape must be (channels, height, width) positive integers, e.g. [1, 8, 8], "
            f"got {image_shape!r}"
        )
    shape = tuple(int(d) for d in image_shape)
    sample = tuple(x.shape[1:])
    if sample == shape:
        return x
    if x.ndim == 4 and not channels_last and sample == (shape[1], shape[2], shape[0]):
        raise ValueError(
            f"{name} has per-sample shape {sample}: channels-last images, but image_shape={list(shape)} is "
            "channels first; pass channels_last=True (--data.channels_last=true) to permute them"
        )
    if x.ndim == 2 and len(shape) == 3 and math.prod(shape) == sample[0]:
        return x.reshape(-1, *shape)
    raise ValueError(
        f"image_shape={list(shape)} does not fit {name} with per-sample shape {sample}: give "
        "(channels, height, width) with channels * height * width values per row, or leave image_shape unset"
    )
