"""The trained weights of a ClusteredModule's K models, to compare before and after a call."""

from __future__ import annotations

import torch

from lightning_fedcluster import ClusteredModule


def cluster_weights(module: ClusteredModule) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.models.parameters()]
