"""Concept label maps: the paper's maps, distinct permutations, how many exist, where two agree."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules.shifts import label_map, labelled_alike, max_concepts


def test_label_maps_match_the_paper() -> None:
    y = torch.arange(10)
    assert torch.equal(label_map(0, 10), y)
    assert torch.equal(label_map(1, 10), 9 - y)
    assert torch.equal(label_map(2, 10), (y + 1) % 10)
    assert torch.equal(label_map(3, 10), (y + 2) % 10)
    assert label_map(0, 10).dtype == torch.long


@pytest.mark.parametrize("num_classes", [2, 3, 4, 7, 10])
def test_label_maps_are_distinct_permutations(num_classes: int) -> None:
    tables = [label_map(c, num_classes) for c in range(max_concepts(num_classes))]
    for table in tables:
        assert torch.equal(table.sort().values, torch.arange(num_classes))
    assert len({tuple(t.tolist()) for t in tables}) == len(tables)


def test_max_concepts() -> None:
    assert max_concepts(2) == 2
    assert max_concepts(3) == 4
    assert max_concepts(10) == 11


def test_label_map_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="concept must be .* distinct label maps"):
        label_map(2, 2)
    with pytest.raises(ValueError, match="concept"):
        label_map(-1, 10)
    with pytest.raises(ValueError, match="num_classes"):
        label_map(0, 1)


def test_labelled_alike_counts_the_rows_another_concept_labels_the_same() -> None:
    # A concept-1 client (y -> 9 - y): label 0 is class 9, label 5 class 4, label 8 class 1.
    # Concept 2 (y -> y + 1) gives class 9 the label 0 and class 4 the label 5 too, class 1 the label 2.
    shares = labelled_alike(torch.tensor([0, 0, 5, 8]), concept=1, num_concepts=3, num_classes=10)
    assert shares.tolist() == [0.0, 1.0, 0.75]
    # The identity agrees with neither on any class of 10.
    assert labelled_alike(torch.tensor([4, 9, 3]), 0, 3, 10).tolist() == [1.0, 0.0, 0.0]
    # 3 classes: the reversal gives classes 0, 1, 2 the labels 2, 1, 0, the shift 1, 2, 0 and the
    # identity 0, 1, 2. Labels 0, 0, 1, 2 of a reversal client are classes 2, 2, 1, 0: the shift
    # labels the two class-2 rows 0 as well, the identity the class-1 row 1.
    assert labelled_alike(torch.tensor([0, 0, 1, 2]), 1, 3, 3).tolist() == [0.25, 1.0, 0.5]


def test_labelled_alike_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_concepts"):
        labelled_alike(torch.tensor([0]), 0, 12, 10)
    with pytest.raises(ValueError, match="num_concepts"):
        labelled_alike(torch.tensor([0]), 0, 2.5, 10)
    with pytest.raises(ValueError, match="concept must be"):
        labelled_alike(torch.tensor([0]), 3, 3, 10)
    with pytest.raises(ValueError, match="labels must lie"):
        labelled_alike(torch.tensor([10]), 0, 3, 10)
    with pytest.raises(ValueError, match="labels is empty"):
        labelled_alike(torch.tensor([], dtype=torch.long), 0, 3, 10)
