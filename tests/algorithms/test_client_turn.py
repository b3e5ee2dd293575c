"""algorithms/client_turn.py: a client's context seeds its generator once, from its seed parts."""

from __future__ import annotations

import torch

from lightning_fedcluster.algorithms.client_turn import ClientContext
from lightning_fedcluster.algorithms.seeds import derive_seed


def _context(**overrides) -> ClientContext:
    options = dict(
        client=3, round_index=1, num_samples=4, num_classes=2, omega=torch.full((2,), 0.5),
        active=torch.ones(2, dtype=torch.bool), seed_parts=(0, 1, 3, 7),
    )  # fmt: skip
    options.update(overrides)
    return ClientContext(**options)


def test_the_generator_is_created_once_from_the_seed_parts():
    context = _context()
    first = context.rng()
    assert first is context.rng()  # cached, not re-seeded
    expected = torch.Generator().manual_seed(derive_seed(0, 1, 3, 7))
    assert torch.equal(torch.rand(3, generator=first), torch.rand(3, generator=expected))
    assert _context(seed_parts=()).rng() is None  # nothing to seed from
