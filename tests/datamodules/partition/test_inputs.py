"""The partitioners' inputs: labels read from any map-style dataset."""

from __future__ import annotations

import torch

from lightning_fedcluster.datamodules import partition
from tests.datamodules.partition.test_label_skew import assert_exact_cover, rng


def test_dataset_labels_reads_targets_or_items() -> None:
    class Items(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            return torch.zeros(2), torch.tensor(2 - i)

    assert partition.dataset_labels(Items()).tolist() == [2, 1, 0]
    tensors = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.tensor([1, 0, 1, 3]))
    assert partition.dataset_labels(tensors).tolist() == [1, 0, 1, 3]

    class WithTargets(Items):
        targets = [5, 6, 7]

    assert partition.dataset_labels(WithTargets()).tolist() == [5, 6, 7]
    parts = partition.dirichlet_split(partition.dataset_labels(tensors), 2, 1.0, rng())
    assert_exact_cover(parts, 4)
