"""A Hugging Face federation for the Flower tests: scikit-learn's digits written to a parquet file
(``write_digits``), two clients made by a Dirichlet partitioner, FedRC with two clusters.
Importable by a deployed Flower app (the factories take no arguments; the file's path comes from
``FEDCLUSTER_TEST_PARQUET``)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning_fedcluster as lf
from lightning_fedcluster import FederatedDataModule
from lightning_fedcluster.models import MLPClassifier

PARQUET = "FEDCLUSTER_TEST_PARQUET"
ROUNDS = 3


def write_digits(path: Path) -> None:
    from datasets import Dataset

    from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors

    x, y = load_digits_tensors()
    Dataset.from_dict({"pixels": x.numpy(), "label": y.numpy()}).to_parquet(str(path))


def make_datamodule() -> FederatedDataModule:
    from flwr_datasets.partitioner import DirichletPartitioner

    return FederatedDataModule.from_hugging_face(
        os.environ[PARQUET], features="pixels", label="label", concepts=2, seed=0, batch_size=16,
        partitioner=DirichletPartitioner(2, "label", alpha=1.0, min_partition_size=50, seed=0),
    )  # fmt: skip


def make_module() -> MLPClassifier:
    return MLPClassifier(hidden=(16,))


def make_strategy() -> lf.FedRCStrategy:
    return lf.FedRCStrategy(2, clients_per_round=2, local_steps=2, seed=0, executor="loop")
