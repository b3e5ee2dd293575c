"""FedRC scenario construction (App. H.8 of the paper) from any labelled tensors.

`build_scenario` turns (x, y) into `FederatedDataModule` constructor arguments with label shift
(Dirichlet skew), feature shift (image corruptions) and concept shift (label maps), plus one
global test client per concept. Its argument checks are in ``scenario_arguments.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

import numpy as np
from torch import Tensor

from lightning_fedcluster.datamodules import partition as partition_module
from lightning_fedcluster.datamodules.scenario_arguments import (
    check_tensors,
    corrupt_fractions_arg,
    corruptions_arg,
    image_shape_arg,
    preset_arg,
    preset_evaluation_fractions,
    proportions_arg,
)
from lightning_fedcluster.datamodules.scenario_clients import (
    ClientPlan,
    check_parts,
    plan_clients,
    scenario_arguments_from,
)
from lightning_fedcluster.datamodules.shifts import (
    AUTHORS_CIFAR10_C,
    AUTHORS_FASHION_MNIST_C,
    label_map,
    max_concepts,
)
from lightning_fedcluster.datamodules.validation import check_num_classes_arg, fraction_arg, int_arg

__all__ = ["build_scenario", "plan_scenario"]

Partition = Sequence[Any] | Callable[[np.ndarray], Sequence[Any]]


def build_scenario(
    x: Tensor,
    y: Tensor,
    *,
    num_clients: int | None = None,
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
    partition: Partition | None = None,
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
    `partition` replaces the label-skew step with a partition of one's own: one array of row ids
    of (x, y) per client (then no row may be held out: pass `global_test` or
    `global_test_fraction=0`), or a function given the client pool's row ids that returns those
    arrays (e.g. a Flower Datasets partitioner run on the pool); `num_clients` is then its length.
    The concepts, corruptions and splits are drawn on top of it as above.
    Returns a dict with client_train, client_test, global_test, num_classes and metadata.
    `client_test[i]` holds client i's `test_fraction` of held-out rows (default 0.2, 0.1 under
    `preset="authors"`); the datamodule built from the dict splits them into validation and test
    and each global client into validation/test x adapt/score (`FederatedDataModule`'s val_share,
    adapt_fraction and seed: pass this seed there too, as `from_tensors` does).
    """
    x, y = check_tensors(x, y)
    global_split = None
    if global_test is not None:
        if not isinstance(global_test, (tuple, list)) or len(global_test) != 2:
            raise TypeError("global_test must be an (x, y) pair of tensors or None")
        global_x, global_y = check_tensors(*global_test, name="global_test")
        if tuple(global_x.shape[1:]) != tuple(x.shape[1:]):
            raise ValueError(
                f"global_test inputs have per-sample shape {tuple(global_x.shape[1:])} but x has "
                f"{tuple(x.shape[1:])}: they must match"
            )
        global_split = (global_x, global_y)
    plan, num_classes = plan_scenario(
        y.numpy(),
        x,
        lambda: (float(x.min()), float(x.max())),
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
        global_labels=None if global_split is None else global_split[1],
        corruptions=corruptions,
        preset=preset,
        partition=partition,
    )
    return scenario_arguments_from(plan, lambda rows: (x[rows], y[rows]), num_classes, global_split)


def plan_scenario(
    labels: np.ndarray,
    x_like: Tensor,
    x_range: Callable[[], tuple[float, float]] | None,
    *,
    num_clients: int | None,
    concepts: int,
    dirichlet_alpha: float | None,
    corrupt_fraction: float | Sequence[float] | None,
    concept_proportions: Sequence[float] | None,
    test_fraction: float | None,
    global_test_fraction: float | None,
    min_client_size: int,
    num_classes: int | None,
    image_shape: tuple[int, int, int] | None,
    seed: int,
    global_labels: Tensor | None,
    corruptions: Sequence[str] | None,
    preset: str | None,
    partition: Partition | None,
) -> tuple[ClientPlan, int]:
    """`build_scenario`'s checks and draws, from the labels alone: the clients' rows, types and
    splits, and the number of classes. `x_like` holds rows of the inputs (all, or a sample) for the
    shape checks; `x_range` gives the inputs' (min, max), checked when a client is corrupted (None:
    the reader checks each corrupted client's rows). `global_labels`: those of a given global set."""
    if global_labels is not None:
        if global_test_fraction not in (None, 0, 0.0):
            raise ValueError(
                f"global_test_fraction={global_test_fraction!r} was given together with global_test: "
                "the global test clients come from one of them; pass global_test_fraction=None"
            )
        global_test_fraction = 0.0
    elif global_test_fraction is None:
        global_test_fraction = 0.0 if partition is not None and not callable(partition) else 0.2
    given = partition is not None
    # A given partition replaces the label skew, so alpha plays no part (the authors' preset too).
    alpha = 1.0 if given else dirichlet_alpha
    authors = preset_arg(preset, concepts, alpha, concept_proportions, corrupt_fraction)
    if authors and corruptions is None:
        channels = image_shape[0] if image_shape is not None else (x_like.shape[1] if x_like.ndim == 4 else 1)
        corruptions = AUTHORS_FASHION_MNIST_C if channels == 1 else AUTHORS_CIFAR10_C
    pool_of_kinds = corruptions_arg(corruptions)
    if not given or num_clients is not None:
        num_clients = int_arg("num_clients", num_clients, 1)
    concepts = int_arg("concepts", concepts, 1)
    if alpha is not None and (
        not isinstance(alpha, Real) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0
    ):
        raise ValueError(
            f"dirichlet_alpha must be a positive number (or None for an IID split), got {dirichlet_alpha!r}"
        )
    test_fraction = fraction_arg("test_fraction", preset_evaluation_fractions(preset, test_fraction, None)[0])
    global_test_fraction = fraction_arg("global_test_fraction", global_test_fraction)
    min_client_size = int_arg("min_client_size", min_client_size, 1)
    seed = int_arg("seed", seed, 0)

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
    if global_labels is not None and (global_labels.min() < 0 or global_labels.max() >= num_classes):
        raise ValueError(
            f"global_test labels must lie in [0, num_classes={num_classes}), found "
            f"[{int(global_labels.min())}, {int(global_labels.max())}]"
        )
    available = max_concepts(num_classes)
    if concepts > available:
        raise ValueError(
            f"concepts={concepts} exceeds the {available} distinct label maps available for "
            f"num_classes={num_classes}; use concepts <= {available}"
        )
    proportions = proportions_arg(concept_proportions, concepts)
    fractions = corrupt_fractions_arg(corrupt_fraction, concepts)

    split_rng, part_rng, type_rng, style_rng, test_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)
    )
    if given:
        if not callable(partition) and global_test_fraction > 0:
            raise ValueError(
                f"partition is a list of row ids, but global_test_fraction={global_test_fraction} holds "
                "rows out for the global test clients after it was made: pass global_test_fraction=0 "
                "(or a global_test set), or a function that partitions the pool it is given"
            )
        pool, held = partition_module.stratified_split(labels, global_test_fraction, split_rng)
        parts = check_parts(partition(pool) if callable(partition) else partition, pool, labels.size)
        if num_clients is not None and num_clients != len(parts):
            raise ValueError(
                f"num_clients={num_clients} but the partition has {len(parts)} clients: leave "
                "num_clients unset (the partition decides it) or make them agree"
            )
        num_clients = len(parts)
    else:
        assert num_clients is not None
        pool_size = labels.size - sum(
            partition_module.held_out_count(int(n), global_test_fraction) for n in np.bincount(labels) if n
        )
        if num_clients * min_client_size > pool_size:
            raise ValueError(
                f"num_clients={num_clients} needs at least num_clients * min_client_size = "
                f"{num_clients * min_client_size} samples, but the client pool has {pool_size} after "
                f"global_test_fraction={global_test_fraction}; use fewer clients or a smaller "
                "min_client_size"
            )
    concept_counts = partition_module.largest_remainder(proportions, num_clients)
    num_corrupted = sum(
        partition_module.corrupted_count(int(n), f) for n, f in zip(concept_counts, fractions, strict=True)
    )
    if authors:
        num_corrupted = int(0.2 * num_clients) + 2 * int(0.1 * num_clients)
    shape = image_shape_arg(image_shape, x_like, needed=num_corrupted > 0)
    if num_corrupted and x_range is not None:
        low, high = x_range()
        if low < 0 or high > 1:
            raise ValueError(
                f"x must be scaled to [0, 1] for corruptions, found values in "
                f"[{low:.3g}, {high:.3g}]; rescale x or pass corrupt_fraction=0"
            )

    if not given:
        pool, held = partition_module.stratified_split(labels, global_test_fraction, split_rng)
        if authors:
            parts = partition_module.prior_dirichlet_split(
                labels[pool], num_clients, float(dirichlet_alpha), part_rng
            )
        elif dirichlet_alpha is None:
            parts = partition_module.iid_split(pool.size, num_clients, part_rng)
        else:
            parts = partition_module.dirichlet_split(
                labels[pool], num_clients, float(dirichlet_alpha), part_rng, min_size=min_client_size
            )
        parts = [pool[part] for part in parts]
    if authors:
        concept, corrupted = partition_module.authors_client_types(num_clients, type_rng)
    else:
        concept, corrupted = partition_module.assign_client_types(
            num_clients, proportions, fractions, type_rng
        )
    maps = [label_map(c, num_classes) for c in range(concepts)]
    plan = plan_clients(
        parts, held, concept, corrupted, maps, shape, pool_of_kinds, test_fraction, style_rng, test_rng
    )
    return plan, num_classes
