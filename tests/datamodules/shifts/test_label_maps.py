"""Concept label maps: the paper's maps, distinct permutations, how many exist."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules.shifts import label_map, max_concepts


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
