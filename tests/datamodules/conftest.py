"""Fixtures shared by the datamodule tests."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as (x [1797, 64] in [0, 1], y [1797])."""
    return load_digits_tensors()
