"""The same scenario from tensors and from a Hugging Face data set with the same partition trains
to the same weights, bit for bit, with the training rows in memory or memory-mapped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr_datasets.partitioner import DirichletPartitioner

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.datamodules.hugging_face.conftest import datasets


def partitioner() -> DirichletPartitioner:
    return DirichletPartitioner(8, "label", alpha=0.5, min_partition_size=10, seed=5)


def trained(dm, executor: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(2, clients_per_round=4, local_steps=3, seed=0, executor=executor)
    trainer = make_trainer(strategy, max_epochs=3, limit_val_batches=0)
    trainer.fit(MLPClassifier(hidden=(16,)), datamodule=dm)
    return [p.detach().clone() for p in trainer.lightning_module.parameters()]


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_tensors_and_a_hugging_face_set_with_the_same_partition_train_alike(
    digits, executor, tmp_path
) -> None:
    x, y = digits
    train, test = np.arange(1500), np.arange(1500, 1797)
    source = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"pixels": x[train].numpy(), "label": y[train].numpy(), "row": train}
            ),
            "test": datasets.Dataset.from_dict({"pixels": x[test].numpy(), "label": y[test].numpy()}),
        }
    )
    reference = partitioner()
    reference.dataset = source["train"]
    parts = [np.asarray(reference.load_partition(i)["row"]) for i in range(8)]  # its row ids
    options = dict(concepts=2, corrupt_fraction=0.0, seed=3, batch_size=16)
    from_tensors = FederatedDataModule.from_tensors(
        x[train], y[train], partition=parts, global_test=(x[test], y[test]), **options
    )
    from_hf = FederatedDataModule.from_hugging_face(
        source, features="pixels", label="label", partitioner=partitioner(), test_split="test", **options
    )
    mapped = FederatedDataModule.from_hugging_face(
        source, features="pixels", label="label", partitioner=partitioner(), test_split="test",
        memory_map=tmp_path, **options,
    )  # fmt: skip
    assert mapped.train_x.untyped_storage().filename == str(tmp_path / "train_x.f32")  # kept mapped
    for i, rows in enumerate(parts):
        np.testing.assert_array_equal(from_hf.source_rows[i], rows)
    weights = trained(from_tensors, executor)
    for dm in (from_hf, mapped):
        assert all(torch.equal(a, b) for a, b in zip(weights, trained(dm, executor), strict=True))
