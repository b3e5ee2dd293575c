"""Fixtures shared by the partition tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """3000 labels over 10 classes, slightly unbalanced."""
    return np.random.default_rng(123).choice(10, size=3000, p=np.linspace(0.06, 0.14, 10))
