"""FedRC scenario construction (App. H.8 of the paper) from any labelled tensors.

`build_scenario` turns (x, y) into `FederatedDataModule` constructor arguments with label shift
(Dirichlet skew), feature shift (image corruptions) and concept shift (label maps), plus one
global test client per concept. Its scenario-specific argument checks live here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.datamodules import partition
from lightning_fedcluster.datamodules.metadata import ClientMetadata
from lightning_fedcluster.datamodules.shifts import (
    ALL_CORRUPTIONS,
    AUTHORS_CIFAR10_C,
    AUTHORS_FASHION_MNIST_C,
    CORRUPTIONS,
    corrupt,
    label_map,
    max_concepts,
)
from lightning_fedcluster.datamodules.validation import (
    Split,
    check_channels_first,
    check_num_classes_arg,
    fraction_arg,
    int_arg,
    is_int,
)

__all__ = ["build_scenario"]


def build_scenario(
    x: Tensor,
    y: Tensor,
    *,
    num_clients: int,
    concepts: int = 1,
    dirichlet_alpha: float | None = 1.0,
    corrupt_fraction: float | Sequence[float] | None = None,
    concept_proportions: Sequence[float] | None = None,
    test_fraction: float | None = None,
    global_test_fraction: float | None = None,
    min_client_size: int = 2,
    num_classes: int | None = None,
    image_shape: tuple[int, int, int] | None = None,
    seed: int = 0,
    global_test: tuple[Tensor, Tensor] | None = None,
    corruptions: Sequence[str] | None = None,
    preset: str | None = None,
) -> dict[str, Any]:
    """Construct the FedRC scenario and return `FederatedDataModule` constructor arguments.

    Steps: stratified global hold-out; Dirichlet(alpha) label skew (IID if alpha is None);
    client types (concept + corrupted flag, exact counts); the concept's label map and, for
    corrupted clients, one corruption of random kind and severity 1..5 on all their inputs;
    per-client train/test split; one global test client per concept on the clean hold-out.
    Every step draws from its own stream of `numpy.random.SeedSequence(seed)`, so e.g. changing
    only `corrupt_fraction` keeps the partition, concepts and train/test rows.

    `global_test_fraction` (default 0.2) of every class is held out for the global test clients;
    pass `global_test=(x_test, y_test)` instead to build them from a separate clean test set (the
    paper uses the datasets' official test sets), and then all of (x, y) goes to the clients.
    `corruptions` is the pool of corruption kinds drawn from (default `shifts.CORRUPTIONS`; e.g.
    `shifts.FASHION_MNIST_C` or `shifts.CIFAR10_C`).
    `preset="authors"` builds the client mix of the FedRC authors' scripts instead
    (create_c/make_fmnist_c.py, make_cifar_c.py): `partition.prior_dirichlet_split` gives every
    client pool_size // num_clients rows with class shares ~ Dir(dirichlet_alpha * p), and
    `partition.authors_client_types` the 40 / 30 / 30 % concepts with 50 / 33 / 33 % of them
    corrupted; it needs concepts=3 and leaves concept_proportions and corrupt_fraction unset.
    Its default pool is the authors' (`shifts.AUTHORS_FASHION_MNIST_C` for one channel, else
    `shifts.AUTHORS_CIFAR10_C`).
    Returns a dict with client_train, client_test, global_test, num_classes and metadata.
    `client_test[i]` holds client i's `test_fraction` of held-out rows (default 0.2, 0.1 under
    `preset="authors"`); the datamodule built from the dict splits them into validation and test
    and each global client into validation/test x adapt/score (`FederatedDataModule`'s val_share,
    adapt_fraction and seed: pass this seed there too, as `from_tensors` does).
    """
    x, y = _check_tensors(x, y)
    if global_test is not None:
        if global_test_fraction not in (None, 0, 0.0):
            raise ValueError(
                f"global_test_fraction={global_test_fraction!r} was given together with global_test: "
                "the global test clients come from one of them; pass global_test_fraction=None"
            )
        if not isinstance(global_test, (tuple, list)) or len(global_test) != 2:
            raise TypeError("global_test must be an (x, y) pair of tensors or None")
        global_x, global_y = _check_tensors(*global_test, name="global_test")
        if tuple(global_x.shape[1:]) != tuple(x.shape[1:]):
            raise ValueError(
                f"global_test inputs have per-sample shape {tuple(global_x.shape[1:])} but x has "
                f"{tuple(x.shape[1:])}: they must match"
            )
        global_test_fraction = 0.0
    elif global_test_fraction is None:
        global_test_fraction = 0.2
    authors = _preset_arg(preset, concepts, dirichlet_alpha, concept_proportions, corrupt_fraction)
    if authors and corruptions is None:
        channels = image_shape[0] if image_shape is not None else (x.shape[1] if x.ndim == 4 else 1)
        corruptions = AUTHORS_FASHION_MNIST_C if channels == 1 else AUTHORS_CIFAR10_C
    pool_of_kinds = _corruptions_arg(corruptions)
    num_clients = int_arg("num_clients", num_clients, 1)
    concepts = int_arg("concepts", concepts, 1)
    if dirichlet_alpha is not None and (
        not isinstance(dirichlet_alpha, Real)
        or isinstance(dirichlet_alpha, bool)
        or not math.isfinite(dirichlet_alpha)
        or dirichlet_alpha <= 0
    ):
        raise ValueError(
            f"dirichlet_alpha must be a positive number (or None for an IID split), got {dirichlet_alpha!r}"
        )
    test_fraction = fraction_arg("test_fraction", preset_evaluation_fractions(preset, test_fraction, None)[0])
    global_test_fraction = fraction_arg("global_test_fraction", global_test_fraction)
    min_client_size = int_arg("min_client_size", min_client_size, 1)
    seed = int_arg("seed", seed, 0)

    labels = y.numpy()
    if labels.min() < 0:
        raise ValueError(f"y must hold class indices >= 0, found label {int(labels.min())}")
    if num_classes is None:
        num_classes = int(labels.max()) + 1
        if num_classes < 2:
            raise ValueError("y holds a single class; pass num_classes >= 2 explicitly")
    check_num_classes_arg(num_classes)
    if labels.max() >= num_classes:
        raise ValueError(
            f"y has label {int(labels.max())} outside [0, num_classes={num_classes}); pass a "
            "larger num_classes or remap the labels"
        )
    if global_test is not None and (global_y.min() < 0 or global_y.max() >= num_classes):
        raise ValueError(
            f"global_test labels must lie in [0, num_classes={num_classes}), found "
            f"[{int(global_y.min())}, {int(global_y.max())}]"
        )
    available = max_concepts(num_classes)
    if concepts > available:
        raise ValueError(
            f"concepts={concepts} exceeds the {available} distinct label maps available for "
            f"num_classes={num_classes}; use concepts <= {available}"
        )
    proportions = _proportions_arg(concept_proportions, concepts)
    fractions = _corrupt_fractions_arg(corrupt_fraction, concepts)

    pool_size = labels.size - sum(
        partition.held_out_count(int(n), global_test_fraction) for n in np.bincount(labels) if n
    )
    if num_clients * min_client_size > pool_size:
        raise ValueError(
            f"num_clients={num_clients} needs at least num_clients * min_client_size = "
            f"{num_clients * min_client_size} samples, but the client pool has {pool_size} after "
            f"global_test_fraction={global_test_fraction}; use fewer clients or a smaller "
            "min_client_size"
        )
    concept_counts = partition.largest_remainder(proportions, num_clients)
    num_corrupted = sum(
        partition.corrupted_count(int(n), f) for n, f in zip(concept_counts, fractions, strict=True)
    )
    if authors:
        num_corrupted = int(0.2 * num_clients) + 2 * int(0.1 * num_clients)
    shape = _image_shape_arg(image_shape, x, needed=num_corrupted > 0)
    if num_corrupted and (x.min() < 0 or x.max() > 1):
        raise ValueError(
            f"x must be scaled to [0, 1] for corruptions, found values in "
            f"[{float(x.min()):.3g}, {float(x.max()):.3g}]; rescale x or pass corrupt_fraction=0"
        )

    split_rng, part_rng, type_rng, style_rng, test_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)
    )
    pool, held = partition.stratified_split(labels, global_test_fraction, split_rng)
    if authors:
        parts = partition.prior_dirichlet_split(labels[pool], num_clients, float(dirichlet_alpha), part_rng)
        concept, corrupted = partition.authors_client_types(num_clients, type_rng)
    elif dirichlet_alpha is None:
        parts = partition.iid_split(pool.size, num_clients, part_rng)
    else:
        parts = partition.dirichlet_split(
            labels[pool], num_clients, float(dirichlet_alpha), part_rng, min_size=min_client_size
        )
    if not authors:
        concept, corrupted = partition.assign_client_types(num_clients, proportions, fractions, type_rng)
    maps = [label_map(c, num_classes) for c in range(concepts)]

    client_train: list[Split] = []
    client_test: list[Split] = []
    styles: list[str] = []
    for i, part in enumerate(parts):
        # Drawn for every client so one client's type never shifts another's randomness.
        kind = pool_of_kinds[int(style_rng.integers(len(pool_of_kinds)))]
        severity = int(style_rng.integers(1, 6))
        noise_seed = int(style_rng.integers(2**62))
        rows = torch.from_numpy(pool[part])
        xi, yi = x[rows], maps[concept[i]][y[rows]]
        if corrupted[i]:
            generator = torch.Generator().manual_seed(noise_seed)
            images = xi.reshape(-1, *shape)
            xi = corrupt(images, kind, severity, generator).reshape(xi.shape)
            styles.append(f"{kind}:{severity}")
        else:
            styles.append("clean")
        train_rows, test_rows = partition.train_test_split(rows.numel(), test_fraction, test_rng)
        train_rows, test_rows = torch.from_numpy(train_rows), torch.from_numpy(test_rows)
        client_train.append((xi[train_rows], yi[train_rows]))
        client_test.append((xi[test_rows], yi[test_rows]))

    global_splits: list[Split] = []
    if global_test is not None:
        global_splits = [(global_x, table[global_y]) for table in maps]
    elif held.size:
        held_rows = torch.from_numpy(held)
        held_x, held_y = x[held_rows], y[held_rows]
        global_splits = [(held_x, table[held_y]) for table in maps]
    metadata = ClientMetadata(
        concept=torch.from_numpy(concept),
        feature_style=styles,
        global_concept=torch.arange(len(global_splits), dtype=torch.long),
    )
    return {
        "client_train": client_train,
        "client_test": client_test,
        "global_test": global_splits,
        "num_classes": num_classes,
        "metadata": metadata,
    }


# ---------------------------------------------------------------------------------------------
# Argument checks of build_scenario.


def preset_evaluation_fractions(
    preset: str | None, test_fraction: float | None, adapt_fraction: float | None
) -> tuple[float, float]:
    """test_fraction and adapt_fraction left as None: the authors' 0.1 and 0.9 under
    preset="authors" (their loader splits every client, global ones too, 90 / 10), else 0.2 and 0.4."""
    authors = preset == "authors"
    test = (0.1 if authors else 0.2) if test_fraction is None else test_fraction
    adapt = (0.9 if authors else 0.4) if adapt_fraction is None else adapt_fraction
    return test, adapt


def _preset_arg(
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


def _corruptions_arg(value: Sequence[str] | None) -> tuple[str, ...]:
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


def _check_tensors(x: Any, y: Any, name: str = "") -> tuple[Tensor, Tensor]:
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


def _proportions_arg(value: Sequence[float] | None, concepts: int) -> list[float]:
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


def _corrupt_fractions_arg(value: float | Sequence[float] | None, concepts: int) -> list[float]:
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


def _image_shape_arg(image_shape: Any, x: Tensor, *, needed: bool) -> tuple[int, ...]:
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
