"""Fixtures shared by the shift tests."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors


@pytest.fixture(scope="module")
def digits8() -> torch.Tensor:
    x, _ = load_digits_tensors()
    return x[:64].reshape(-1, 1, 8, 8)
