"""Hold-outs and natural splits: stratified hold-outs, train/test, per-id parts, unseen clients.

These split rows (or whole clients) into kept and held-out positions with exact, reproducible
counts; they do not skew labels (see `partition.label_skew` for that).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np

from lightning_fedcluster.datamodules.partition.counts import held_out_count, largest_remainder
from lightning_fedcluster.datamodules.partition.inputs import count_arg

__all__ = [
    "holdout_clients",
    "natural_split",
    "stratified_split",
    "stratified_subset",
    "train_test_split",
]


def stratified_split(
    labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split positions into (kept, held out), holding out `fraction` of every class.

    Returns sorted position arrays; per class, `held_out_count(n_class, fraction)` are held out.
    """
    labels = np.asarray(labels)
    kept: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_held = held_out_count(members.size, fraction)
        held.append(members[:n_held])
        kept.append(members[n_held:])
    empty = np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(kept + [empty])), np.sort(np.concatenate(held + [empty]))


def stratified_subset(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` sorted positions drawn without replacement, keeping every class's share (the class
    counts are `largest_remainder` of the class frequencies)."""
    labels = np.asarray(labels)
    if isinstance(size, bool) or not isinstance(size, Integral) or not 1 <= size <= labels.size:
        raise ValueError(f"size must be an integer in [1, {labels.size}], got {size!r}")
    classes, counts = np.unique(labels, return_counts=True)
    wanted = largest_remainder(counts, int(size))
    chosen = [
        rng.choice(np.flatnonzero(labels == cls), size=int(n), replace=False)
        for cls, n in zip(classes, wanted, strict=True)
    ]
    return np.sort(np.concatenate(chosen))


def train_test_split(
    num_samples: int, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random (train, test) positions; the test part is rounded but always leaves >= 1 train."""
    n_test = min(held_out_count(num_samples, test_fraction), max(0, num_samples - 1))
    order = rng.permutation(num_samples)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def natural_split(client_ids: Any) -> list[np.ndarray]:
    """One part per distinct client id (any sortable values: ints, strings), in sorted id order."""
    ids = np.asarray(client_ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"client_ids must be a non-empty 1-D array, got shape {ids.shape}")
    _, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse))[:-1]
    return np.split(order, bounds)


def holdout_clients(
    num_clients: int, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out whole clients as unseen clients (FedEM's 80/20 is fraction=0.2).

    Returns sorted (participating, unseen) client indices; `held_out_count(M, fraction)` are
    unseen and at least one client always participates.
    """
    num_clients = count_arg("num_clients", num_clients)
    fraction = _fraction("unseen fraction", fraction)
    n_unseen = min(held_out_count(num_clients, fraction), num_clients - 1)
    order = rng.permutation(num_clients)
    return np.sort(order[n_unseen:]), np.sort(order[:n_unseen])
