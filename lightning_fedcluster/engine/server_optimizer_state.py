"""The server optimizer's state (``FederatedStrategy(server_optimizer=...)``): one set of float64
tensors per federated tensor of every cluster (and of the shared layers), created at the first
update a cluster receives, kept on the models' device, identical on every process (each applies
the same all-reduced update) and checkpointed with the module. The math is in
``algorithms/server_optimizer.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig, direction

SERVER_OPTIMIZER_KEY = "fedcluster_server_optimizer"


class ServerOptimizer:
    """The state of ``config``'s server optimizer, keyed "group.index.name" (group: "cluster{k}"
    or "shared")."""

    def __init__(self, config: ServerOptimizerConfig) -> None:
        self.config = config
        self.state: dict[str, Tensor] = {}

    def step(
        self,
        group: str,
        reference: Sequence[Tensor],
        delta_sum: Sequence[Tensor],
        weight_sum: float,
        server_lr: float,
    ) -> bool:
        """θ ← θ + η_g · direction(Σ w Δ / Σ w), in place. A group without weight this round keeps its
        model and its state (no pseudo-gradient was observed). Returns whether the model changed."""
        if weight_sum <= 0:
            return False
        with torch.no_grad():
            for i, (ref, acc) in enumerate(zip(reference, delta_sum, strict=True)):
                state = {name: self._tensor(f"{group}.{i}.{name}", acc) for name in self.config.state_names()}
                step = direction(self.config, acc.double() / weight_sum, state)
                ref.add_((step * server_lr).to(ref.dtype))
        return True

    def _tensor(self, key: str, like: Tensor) -> Tensor:
        value = self.state.get(key)
        if value is None or value.shape != like.shape:
            name = key.rsplit(".", 1)[1]
            value = torch.full(like.shape, self.config.initial(name), dtype=torch.float64, device=like.device)
        elif value.device != like.device:
            value = value.to(like.device)
        self.state[key] = value
        return value

    def reset(self, group: str) -> None:
        """Forget ``group``'s state (its model was replaced, e.g. a re-seeded cluster)."""
        for key in [k for k in self.state if k.split(".", 1)[0] == group]:
            del self.state[key]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.config.kind, "state": {k: v.cpu().clone() for k, v in self.state.items()}}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if saved["kind"] != self.config.kind:
            raise ValueError(
                f"the checkpoint holds server_optimizer={saved['kind']!r} state but this run uses "
                f"server_optimizer={self.config.kind!r}: resume with the server optimizer that wrote it"
            )
        self.state = {k: v.clone() for k, v in saved["state"].items()}


def cluster_group(k: int) -> str:
    return f"cluster{k}"
