"""`from_hugging_face` with Flower Datasets partitioners: client i holds exactly partition i."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    PathologicalPartitioner,
)

from lightning_fedcluster.datamodules import FederatedDataModule, shifts
from tests.datamodules.hugging_face.conftest import datasets

PARTITIONERS = {
    "iid": lambda: IidPartitioner(num_partitions=10),
    "dirichlet": lambda: DirichletPartitioner(10, "label", alpha=0.5, min_partition_size=5, seed=3),
    "pathological": lambda: PathologicalPartitioner(10, "label", num_classes_per_partition=2, seed=3),
    "natural_id": lambda: NaturalIdPartitioner(partition_by="writer"),
}


def partitioner_rows(dataset, make) -> list[np.ndarray]:
    """The row ids the partitioner itself returns for each partition, on its own."""
    partitioner = make()
    partitioner.dataset = dataset
    return [np.asarray(partitioner.load_partition(i)["row"]) for i in range(partitioner.num_partitions)]


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_the_clients_are_the_partitions_the_partitioner_returns(digits_dataset, digits, name) -> None:
    x, y = digits
    expected = partitioner_rows(digits_dataset, PARTITIONERS[name])
    dm = FederatedDataModule.from_hugging_face(
        digits_dataset, features="pixels", label="label", partitioner=PARTITIONERS[name](),
        concepts=2, test_fraction=0.0, global_test_fraction=0.0, seed=1,
    )  # fmt: skip
    assert dm.num_clients == len(expected)
    maps = [shifts.label_map(c, 10) for c in range(2)]
    for i, rows in enumerate(expected):
        np.testing.assert_array_equal(dm.source_rows[i], rows)
        xi, yi = dm.train_split(i)  # test_fraction=0: every row trains, in the partition's order
        rows = torch.from_numpy(rows)
        assert torch.equal(xi, x[rows])
        assert torch.equal(yi, maps[int(dm.metadata.concept[i])][y[rows]])  # the concept's label map
    assert set(dm.metadata.concept.tolist()) == {0, 1}
    if name == "natural_id":
        assert dm.natural_ids == list(range(12))


def test_the_pool_after_the_global_hold_out_is_what_the_partitioner_splits(digits_dataset) -> None:
    dm = FederatedDataModule.from_hugging_face(
        digits_dataset, features="pixels", label="label", partitioner=IidPartitioner(8), seed=0
    )
    held = dm.global_offsets[-1].item()
    rows = np.concatenate(dm.source_rows)
    assert dm.num_global_clients == 1 and held == round(0.2 * 1797)  # one clean hold-out (one concept)
    assert rows.size == np.unique(rows).size == 1797 - held  # every pool row, once


def test_a_parquet_file_read_offline_gives_the_same_clients(digits_dataset, tmp_path) -> None:
    path = tmp_path / "digits.parquet"
    digits_dataset.to_parquet(str(path))
    options = dict(features="pixels", label="label", concepts=3, seed=4)
    from_file = FederatedDataModule.from_hugging_face(
        path, partitioner=NaturalIdPartitioner("writer"), cache_dir=str(tmp_path / "cache"), **options
    )
    in_memory = FederatedDataModule.from_hugging_face(
        digits_dataset, partitioner=NaturalIdPartitioner("writer"), **options
    )
    assert from_file.num_clients == in_memory.num_clients == 12
    for name in ("train_x", "train_y", "val_x", "test_y", "global_x", "global_y"):
        assert torch.equal(getattr(from_file, name), getattr(in_memory, name)), name
    assert torch.equal(from_file.metadata.concept, in_memory.metadata.concept)


def test_a_natural_id_keeps_a_concept_column_or_function_for_diagnostics(digits_dataset) -> None:
    with_concept = digits_dataset.map(lambda row: {"group": row["writer"] % 3})
    dm = FederatedDataModule.from_hugging_face(
        with_concept, features="pixels", label="label", partitioner=NaturalIdPartitioner("writer"),
        concept="group",
    )  # fmt: skip
    assert dm.metadata.concept.tolist() == [w % 3 for w in range(12)]
    by_id = FederatedDataModule.from_hugging_face(
        digits_dataset, features="pixels", label="label", partitioner=NaturalIdPartitioner("writer"),
        concept=lambda writer: int(writer >= 6),
    )  # fmt: skip
    assert by_id.metadata.concept.tolist() == [0] * 6 + [1] * 6
    assert torch.equal(by_id.train_x, dm.train_x)  # labels not mapped: the concept is metadata only


def test_a_csv_file_of_number_columns_and_a_saved_data_set_read_offline(digits, tmp_path) -> None:
    x, y = digits
    columns = {f"p{j}": x[:, j].numpy() for j in range(64)}
    table = datasets.Dataset.from_dict({**columns, "label": y.numpy()})
    table.to_csv(str(tmp_path / "digits.csv"), index=False)
    table.save_to_disk(str(tmp_path / "saved"))
    options = dict(features=list(columns), label="label", global_test_fraction=0.0, test_fraction=0.0)
    for source in (tmp_path / "digits.csv", tmp_path / "saved"):
        dm = FederatedDataModule.from_hugging_face(
            source, partitioner=IidPartitioner(5), cache_dir=str(tmp_path / "cache"), **options
        )
        for i, rows in enumerate(dm.source_rows):
            torch.testing.assert_close(dm.train_split(i)[0], x[torch.from_numpy(rows)])  # csv: decimal text
