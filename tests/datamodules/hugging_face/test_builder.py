"""``FederatedDataModule.from_hugging_face``: bad input stops before training, naming the column
or the client and the fix; and the same scenario from tensors and from a Hugging Face data set with
the same partition trains to the same weights, bit for bit, with the training rows in memory or
memory-mapped."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, NaturalIdPartitioner

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import FederatedDataModule, scenario_clients
from lightning_fedcluster.datamodules.hugging_face import require_hf
from lightning_fedcluster.flower.node import NodeConfigError, node_clients
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.datamodules.hugging_face.conftest import datasets, write_image_folder


def build(dataset, partitioner=None, **options):
    options = {"features": "pixels", "label": "label", "global_test_fraction": 0.0, **options}
    return FederatedDataModule.from_hugging_face(
        dataset, partitioner=partitioner or IidPartitioner(4), **options
    )


def test_a_missing_column_is_named(digits_dataset) -> None:
    with pytest.raises(ValueError, match=r"features: column 'pixel' is not in split 'train', whose columns"):
        build(digits_dataset, features="pixel")
    with pytest.raises(ValueError, match=r"label: column 'class' is not in split 'train'.*pass label="):
        build(digits_dataset, label="class")


def test_a_label_column_of_strings_names_the_encoding(digits_dataset) -> None:
    names = digits_dataset.map(lambda row: {"name": f"digit {row['label']}"})
    with pytest.raises(ValueError, match=r"label column 'name' holds strings.*class_encode_column\('name'\)"):
        build(names, label="name")
    encoded = names.class_encode_column("name")  # the fix the message names
    assert build(encoded, label="name").num_classes == 10
    floats = digits_dataset.map(lambda row: {"score": float(row["label"])})
    with pytest.raises(ValueError, match=r"label column 'score' holds float64 values.*cast_column"):
        build(floats, label="score")


def test_a_partitioner_leaving_a_client_empty_names_it() -> None:
    small = datasets.Dataset.from_dict({"pixels": np.zeros((40, 2)), "label": [0, 1, 2, 3] * 10})
    skewed = DirichletPartitioner(10, "label", alpha=0.05, min_partition_size=0, seed=0)  # 4 are empty
    with pytest.raises(ValueError, match=r"the partition leaves client 1 empty: every client needs"):
        build(small, skewed)
    with pytest.raises(
        ValueError, match=r"the partitioner has 50 partitions but the client pool has 40 rows"
    ):
        build(small, IidPartitioner(num_partitions=50))


def test_a_used_partitioner_or_another_object_is_refused(digits_dataset) -> None:
    used = IidPartitioner(4)
    used.dataset = digits_dataset
    with pytest.raises(ValueError, match="the partitioner already has a data set: pass a new one"):
        build(digits_dataset, used)
    with pytest.raises(TypeError, match="partitioner must be a flwr_datasets.partitioner.Partitioner"):
        build(digits_dataset, [np.arange(10)])


def test_a_partition_id_out_of_range_names_the_node_config(digits_dataset) -> None:
    dm = build(digits_dataset, NaturalIdPartitioner("writer"))
    assert node_clients({"partition-id": 1, "num-partitions": 12}, dm.num_clients).tolist() == [1]
    with pytest.raises(
        NodeConfigError, match=r"partition-id=12 must be between 0 and num-partitions - 1 = 11"
    ):
        node_clients({"partition-id": 12, "num-partitions": 12}, dm.num_clients)


def test_images_of_mixed_sizes_name_the_column_or_the_client(tmp_path, monkeypatch) -> None:
    write_image_folder(tmp_path / "mixed", sizes={5: (9, 8)})  # one image in the first client's block
    with pytest.raises(ValueError, match=r"image column 'image' holds images of different sizes"):
        build(tmp_path / "mixed", features="image", cache_dir=str(tmp_path / "c"))
    monkeypatch.setattr(scenario_clients, "BLOCK_ROWS", 1)  # one read per client: sizes differ across reads
    write_image_folder(tmp_path / "other", sizes={k: (6, 6) for k in range(27, 36)})  # the last client's
    with pytest.raises(ValueError, match=r"client 3's inputs \('image'\) have per-sample shape \(3, 6, 6\)"):
        build(tmp_path / "other", features="image", test_fraction=0.0, cache_dir=str(tmp_path / "c"))


def test_without_the_extra_the_message_names_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flwr_datasets", None)  # import flwr_datasets raises ImportError
    with pytest.raises(ImportError, match=r"need the `hf` extra.*pip install \"lightning-fedcluster\[hf\]\""):
        require_hf()



def dirichlet() -> DirichletPartitioner:
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
    reference = dirichlet()
    reference.dataset = source["train"]
    parts = [np.asarray(reference.load_partition(i)["row"]) for i in range(8)]  # its row ids
    options = dict(concepts=2, corrupt_fraction=0.0, seed=3, batch_size=16)
    from_tensors = FederatedDataModule.from_tensors(
        x[train], y[train], partition=parts, global_test=(x[test], y[test]), **options
    )
    from_hf = FederatedDataModule.from_hugging_face(
        source, features="pixels", label="label", partitioner=dirichlet(), test_split="test", **options
    )
    mapped = FederatedDataModule.from_hugging_face(
        source, features="pixels", label="label", partitioner=dirichlet(), test_split="test",
        memory_map=tmp_path, **options,
    )  # fmt: skip
    assert mapped.train_x.untyped_storage().filename == str(tmp_path / "train_x.f32")  # kept mapped
    for i, rows in enumerate(parts):
        np.testing.assert_array_equal(from_hf.source_rows[i], rows)
    weights = trained(from_tensors, executor)
    for dm in (from_hf, mapped):
        assert all(torch.equal(a, b) for a, b in zip(weights, trained(dm, executor), strict=True))
