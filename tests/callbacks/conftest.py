"""Shared fixtures of the callback tests: a small digits scenario with three concepts."""

from __future__ import annotations

import pytest

from lightning_fedcluster.datamodules import DigitsFederated


@pytest.fixture(scope="module")
def digits() -> DigitsFederated:
    return DigitsFederated(num_clients=9, concepts=3, seed=0)
