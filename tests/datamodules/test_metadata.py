"""ClientMetadata: the ground truth of a scenario, checked on construction."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules import ClientMetadata


def test_metadata_mixture_is_checked() -> None:
    meta = ClientMetadata(
        torch.tensor([0, 1]),
        ["clean"] * 2,
        torch.tensor([0, 1]),
        mixture=torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64),
    )
    assert meta.mixture.dtype == torch.float32
    for bad in (
        torch.tensor([[0.5, 0.4], [0.3, 0.7]]),
        torch.tensor([0.5, 0.5]),
        torch.tensor([[1.2, -0.2], [0.3, 0.7]]),
        torch.tensor([[1, 0], [0, 1]]),
    ):
        with pytest.raises(ValueError, match="metadata.mixture must be"):
            ClientMetadata(torch.tensor([0, 1]), ["clean"] * 2, torch.tensor([0]), mixture=bad)
