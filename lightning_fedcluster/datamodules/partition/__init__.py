"""Pure partition functions: hold-outs, label-skew and mixture splits, client types, train/test.

All functions take label arrays (or client ids, source ids, sizes) and a
`numpy.random.Generator`, and return index arrays (positions into the input), so they never touch
the data itself, work for tensors and any map-style dataset alike (see `dataset_labels`), and are
reproducible: the same generator state gives the same partition.

The functions live in focused modules and are re-exported here, the place to import them from:
`counts` (exact counts, client types), `holdout` (hold-outs, train/test, natural splits, unseen
clients), `label_skew` (IID, Dirichlet, n-class, cluster-wise), `mixture` (FedSoft mixtures) and
`inputs` (argument checks, dataset labels).
"""

from __future__ import annotations

from lightning_fedcluster.datamodules.partition.counts import (
    assign_client_types,
    authors_client_types,
    corrupted_count,
    held_out_count,
    largest_remainder,
)
from lightning_fedcluster.datamodules.partition.holdout import (
    holdout_clients,
    natural_split,
    stratified_split,
    stratified_subset,
    train_test_split,
)
from lightning_fedcluster.datamodules.partition.inputs import dataset_labels
from lightning_fedcluster.datamodules.partition.label_skew import (
    cluster_dirichlet_split,
    cluster_n_class_split,
    dirichlet_split,
    iid_split,
    n_class_split,
    prior_dirichlet_split,
)
from lightning_fedcluster.datamodules.partition.mixture import (
    MIXTURE_PATTERNS,
    mixture_counts,
    mixture_split,
    mixture_weights,
)

__all__ = [
    "MIXTURE_PATTERNS",
    "assign_client_types",
    "authors_client_types",
    "cluster_dirichlet_split",
    "cluster_n_class_split",
    "corrupted_count",
    "dataset_labels",
    "dirichlet_split",
    "held_out_count",
    "holdout_clients",
    "iid_split",
    "largest_remainder",
    "mixture_counts",
    "mixture_split",
    "mixture_weights",
    "n_class_split",
    "natural_split",
    "prior_dirichlet_split",
    "stratified_split",
    "stratified_subset",
    "train_test_split",
]
