"""Shared fixtures of the strategy tests: the digits scenario every strategy trains on."""

from __future__ import annotations

import pytest

from lightning_fedcluster.datamodules import DigitsFederated


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)
