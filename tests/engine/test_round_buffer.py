"""engine/round_buffer.py: a round's named segments share one flat tensor."""

import pytest
import torch

from lightning_fedcluster.engine.round_buffer import RoundBuffer
from tests.helpers.algorithms import F64, t


def test_round_buffer_segments_share_one_flat_tensor():
    buffer = RoundBuffer({"omega": (2, 3), "reported": (2,)})
    buffer["omega"][1] = t([0.1, 0.2, 0.7])
    buffer["reported"][1] = 1.0
    assert buffer.flat.tolist() == [0, 0, 0, 0.1, 0.2, 0.7, 0, 1.0]
    buffer.replace(buffer.flat * 2)
    assert buffer["reported"].tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="shape"):
        buffer.replace(torch.zeros(3, dtype=F64))
