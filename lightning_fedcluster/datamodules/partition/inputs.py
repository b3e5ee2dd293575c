"""Inputs of the partition functions: shared argument checks and the labels of a dataset.

`count_arg` and `labels_arg` give every partitioner the same error messages; `dataset_labels`
reads the labels of any map-style dataset so the partitioners work on datasets as on tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["count_arg", "dataset_labels", "labels_arg"]

from lightning_fedcluster.arguments import int_arg


def count_arg(name: str, value: Any, minimum: int = 1) -> int:
    """`value` as an int; ValueError naming `name` unless it is an integer >= `minimum`."""
    return int_arg(name, value, minimum)


def labels_arg(labels: Any, name: str = "labels") -> np.ndarray:
    """`labels` as a non-empty 1-D array of integers >= 0; ValueError naming `name` otherwise."""
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{name} must hold integer class indices, got dtype {array.dtype}; map the classes to "
            "0..C-1 first (e.g. np.unique(values, return_inverse=True)[1])"
        )
    if array.min() < 0:
        raise ValueError(f"{name} must be >= 0, found {int(array.min())}")
    return array


def dataset_labels(dataset: Any) -> np.ndarray:
    """The label of every item of a map-style dataset, as an int64 array.

    Uses the dataset's `targets` or `labels` attribute when it has one (torchvision datasets
    do), else reads `dataset[i][1]` for every item. The result feeds any partitioner here.
    """
    for attribute in ("targets", "labels"):
        values = getattr(dataset, attribute, None)
        if values is not None and not callable(values):
            return np.asarray(values).astype(np.int64).reshape(-1)
    try:
        size = len(dataset)
    except TypeError as error:
        raise TypeError(
            f"dataset must be a map-style dataset (with __len__ and __getitem__), got "
            f"{type(dataset).__name__}"
        ) from error
    return np.asarray([int(dataset[i][1]) for i in range(size)], dtype=np.int64)
