"""Distribution shifts applied per client: concept label maps and image corruptions.

Concept shift is a permutation of the labels (FedRC App. H.8); feature shift is a corruption of
one kind and severity (FashionMNIST-C / CIFAR-10-C style) applied to all of a client's inputs.
The default pool `CORRUPTIONS` is pure torch (no torchvision) so it runs with the CPU-only
wheel. `FASHION_MNIST_C` and `CIFAR10_C` are the two papers' families; the CIFAR-10-C kinds that
torchvision implements (`TORCHVISION_CORRUPTIONS`: JPEG, elastic transform, saturation) use it,
imported when first applied (the `vision` extra).

The label maps live in `label_maps`, the default pool in `default`, the rest of the families in
`extra`, and `corrupt` with the family lists in `corruptions`; they are re-exported here, the
place to import them from.
"""

from __future__ import annotations

from lightning_fedcluster.datamodules.shifts.corruptions import (
    ALL_CORRUPTIONS,
    AUTHORS_CIFAR10_C,
    AUTHORS_FASHION_MNIST_C,
    CIFAR10_C,
    FASHION_MNIST_C,
    corrupt,
)
from lightning_fedcluster.datamodules.shifts.default import CORRUPTIONS
from lightning_fedcluster.datamodules.shifts.extra import SEVERITY_FREE, TORCHVISION_CORRUPTIONS
from lightning_fedcluster.datamodules.shifts.label_maps import label_map, labelled_alike, max_concepts

__all__ = [
    "ALL_CORRUPTIONS",
    "AUTHORS_CIFAR10_C",
    "AUTHORS_FASHION_MNIST_C",
    "CIFAR10_C",
    "CORRUPTIONS",
    "FASHION_MNIST_C",
    "SEVERITY_FREE",
    "TORCHVISION_CORRUPTIONS",
    "corrupt",
    "label_map",
    "labelled_alike",
    "max_concepts",
]
