"""Server-side weighted averaging of client updates: plain tensors only."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def accumulate_delta(
    accumulator: Sequence[Tensor], local: Sequence[Tensor], reference: Sequence[Tensor], weight: float
) -> None:
    """accumulator += weight · (local − reference), tensor by tensor, in the accumulator's dtype.

    Accumulators are float64 so that the sum does not depend on the order in which clients
    arrive (1 and N processes then give the same float32 result).
    """
    for acc, new, old in zip(accumulator, local, reference, strict=True):
        acc.add_((new.detach() - old).to(acc.dtype), alpha=weight)


def apply_weighted_update(
    reference: Sequence[Tensor], delta_sum: Sequence[Tensor], weight_sum: float, server_lr: float = 1.0
) -> bool:
    """θ ← θ + η_g · Σ_i w_i Δθ_i / Σ_i w_i, in place. A cluster with no weight keeps its model.

    Returns whether the model changed.
    """
    if weight_sum <= 0:
        return False
    scale = server_lr / weight_sum
    with torch.no_grad():
        for ref, acc in zip(reference, delta_sum, strict=True):
            ref.add_((acc * scale).to(ref.dtype))
    return True
