"""The public names: everything importable from `lightning_fedcluster.datamodules` and from its
`partition`, `shifts` and `datasets` subpackages, as the README lists them."""

from __future__ import annotations

import importlib

import pytest

import lightning_fedcluster.datamodules as datamodules

README_PARTITION = [
    "iid_split", "dirichlet_split", "n_class_split", "cluster_dirichlet_split", "cluster_n_class_split",
    "mixture_weights", "mixture_counts", "mixture_split", "natural_split", "holdout_clients",
    "stratified_subset", "prior_dirichlet_split", "authors_client_types", "dataset_labels",
]  # fmt: skip
README_SHIFTS = [
    "label_map", "corrupt", "CORRUPTIONS", "FASHION_MNIST_C", "CIFAR10_C", "TORCHVISION_CORRUPTIONS",
    "SEVERITY_FREE", "AUTHORS_FASHION_MNIST_C", "AUTHORS_CIFAR10_C",
]  # fmt: skip


@pytest.mark.parametrize(
    "package",
    [
        "lightning_fedcluster.datamodules",
        "lightning_fedcluster.datamodules.partition",
        "lightning_fedcluster.datamodules.shifts",
        "lightning_fedcluster.datamodules.datasets",
    ],
)
def test_every_exported_name_is_defined(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__ and sorted(module.__all__) == sorted(set(module.__all__))
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{package} exports undefined names {missing}"


def test_partition_and_shifts_give_what_the_readme_lists() -> None:
    from lightning_fedcluster.datamodules import partition, shifts

    assert set(README_PARTITION) <= set(partition.__all__)
    assert set(README_SHIFTS) <= set(shifts.__all__)
    assert all(callable(getattr(partition, name)) for name in README_PARTITION)
    assert callable(shifts.corrupt) and callable(shifts.label_map)


def test_datamodules_are_one_class_wherever_imported() -> None:
    from lightning_fedcluster import FederatedDataModule
    from lightning_fedcluster.datamodules import datasets, federated

    assert FederatedDataModule is datamodules.FederatedDataModule is federated.FederatedDataModule
    for name in datasets.__all__:
        cls = getattr(datamodules, name)
        assert cls is getattr(datasets, name) and issubclass(cls, FederatedDataModule)
