"""Named segments of one flat tensor: everything a round's clients report (ω, label sums,
per-client and per-sample algorithm state, server weights, metrics) travels in a single
all-reduce. Each client writes only its own rows, so summing over processes assembles the
whole round exactly."""

from __future__ import annotations

import math

import torch
from torch import Tensor


class RoundBuffer:
    """``shapes``: name → shape of the segment. Views returned by ``buffer[name]`` write into
    ``buffer.flat``; ``replace(flat)`` swaps in the reduced tensor."""

    def __init__(
        self,
        shapes: dict[str, tuple[int, ...]],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.shapes = dict(shapes)
        self.sizes = [math.prod(shape) for shape in self.shapes.values()]
        self.flat = torch.zeros(sum(self.sizes), dtype=dtype, device=device)

    def __getitem__(self, name: str) -> Tensor:
        start = 0
        for key, size in zip(self.shapes, self.sizes, strict=True):
            if key == name:
                return self.flat[start : start + size].view(self.shapes[name])
            start += size
        raise KeyError(name)

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def replace(self, flat: Tensor) -> None:
        if flat.shape != self.flat.shape:
            raise ValueError(
                f"reduced buffer has shape {tuple(flat.shape)}, expected {tuple(self.flat.shape)}"
            )
        self.flat = flat
