"""The trained weights of a ClusteredModule's K models, to compare before and after a call, and the
check that a resumed fit ended where the straight one did."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from lightning_fedcluster import ClusteredModule


def cluster_weights(module: ClusteredModule) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.models.parameters()]


def assert_same_fit(straight: pl.Trainer, resumed: pl.Trainer) -> None:
    """Bit-identical weights and client store (ω, label sums, every extra entry) after both fits."""
    for a, b in zip(
        straight.lightning_module.state_dict().values(),
        resumed.lightning_module.state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b)
    expected = straight.lightning_module.client_state.state_dict()
    got = resumed.lightning_module.client_state.state_dict()
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert torch.equal(value, got[name]), name
