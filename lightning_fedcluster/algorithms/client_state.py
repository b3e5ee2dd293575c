"""Per-client state that persists across rounds (ω, label sums, participation): plain tensors.

One store for all clients, a few numbers per client, so memory is O(M·K·C) floats and never
O(M × model). It is checkpointed with the module, so resuming at a round boundary is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ClientState:
    """ω [M, K] (mixture weights, float64), label_sums [M, C, K] (latest S_i reported by each
    client, float64), seen [M] (whether the client has reported at least once)."""

    omega: Tensor
    label_sums: Tensor
    seen: Tensor

    @classmethod
    def initial(cls, num_clients: int, num_classes: int, num_clusters: int) -> ClientState:
        return cls(
            omega=torch.full((num_clients, num_clusters), 1.0 / num_clusters, dtype=torch.float64),
            label_sums=torch.zeros(num_clients, num_classes, num_clusters, dtype=torch.float64),
            seen=torch.zeros(num_clients, dtype=torch.bool),
        )

    @property
    def num_clients(self) -> int:
        return self.omega.shape[0]

    @property
    def num_clusters(self) -> int:
        return self.omega.shape[1]

    def record(self, clients: Tensor, omega: Tensor, label_sums: Tensor) -> None:
        """Store what the given clients reported this round."""
        self.omega[clients] = omega.to(self.omega.dtype)
        self.label_sums[clients] = label_sums.to(self.label_sums.dtype)
        self.seen[clients] = True

    def state_dict(self) -> dict[str, Tensor]:
        return {"omega": self.omega.clone(), "label_sums": self.label_sums.clone(), "seen": self.seen.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in ("omega", "label_sums", "seen"):
            current, stored = getattr(self, name), state[name]
            if current.shape != stored.shape:
                raise ValueError(
                    f"checkpointed client state '{name}' has shape {tuple(stored.shape)} but this run "
                    f"expects {tuple(current.shape)}: resume with the same datamodule and num_clusters"
                )
            current.copy_(stored)
