"""Reading a Hugging Face data set: its rows in the data set's own order (an indices mapping
included) as Arrow columns, and an image folder written by the test decoded to [C, H, W] in
[0, 1], corrupted on top."""

from __future__ import annotations

import numpy as np
import torch
from flwr_datasets.partitioner import IidPartitioner

from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.datamodules.hugging_face.source import arrow_table, column_array
from tests.datamodules.hugging_face.conftest import datasets, write_image_folder


def test_columns_are_read_in_the_data_sets_own_row_order(tmp_path) -> None:
    """A data set read from parquet (a memory-mapped table), and views of it with an indices
    mapping (``shuffle``, ``select``, as a partitioner's partitions are), give their own rows."""
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict({"a": list(range(20)), "b": [f"r{i}" for i in range(20)]}).to_parquet(path)
    cache = str(tmp_path / "cache")
    full = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=cache)
    view = full.shuffle(seed=0).select([4, 1, 7])
    expected = list(view["a"])
    assert sorted(expected) != expected  # the mapping's order, not the table's
    assert arrow_table(view).column("a").to_pylist() == expected and arrow_table(view).num_rows == 3
    assert column_array(view, "a").tolist() == expected
    assert column_array(view, "a", [2, 0]).tolist() == [expected[2], expected[0]]
    assert column_array(full, "a", [5, 19]).tolist() == [5, 19]
    assert arrow_table(full).num_rows == 20 and column_array(full, "b")[3] == "r3"


def test_an_image_folder_is_decoded_partitioned_and_corrupted(tmp_path) -> None:
    arrays = write_image_folder(tmp_path / "images")
    dm = FederatedDataModule.from_hugging_face(
        tmp_path / "images", features="image", label="label", partitioner=IidPartitioner(6),
        test_fraction=0.0, global_test_fraction=0.0, concepts=2, corrupt_fraction=0.5,
        cache_dir=str(tmp_path / "cache"), seed=0,
    )  # fmt: skip
    assert dm.train_x.shape == (36, 3, 8, 8) and dm.num_classes == 3
    styles = dm.metadata.feature_style
    assert 0 < sum(style != "clean" for style in styles) < 6  # corrupt_fraction=0.5 of each concept
    decoded = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255
    for i, rows in enumerate(dm.source_rows):
        xi, _ = dm.train_split(i)
        same = torch.equal(xi, decoded[torch.from_numpy(rows)])
        assert same == (styles[i] == "clean"), (i, styles[i])


def test_a_transform_runs_on_the_decoded_rows(tmp_path) -> None:
    write_image_folder(tmp_path / "images")
    options = dict(features="image", label="label", global_test_fraction=0.0, cache_dir=str(tmp_path / "c"))
    plain = FederatedDataModule.from_hugging_face(
        tmp_path / "images", partitioner=IidPartitioner(3), **options
    )
    flat = FederatedDataModule.from_hugging_face(
        tmp_path / "images",
        partitioner=IidPartitioner(3),
        transform=lambda x: x.flatten(1) * 2 - 1,
        **options,
    )
    assert flat.train_x.shape == (plain.train_x.shape[0], 192)
    assert torch.equal(flat.train_x, plain.train_x.flatten(1) * 2 - 1)
