"""D-FedEM (Marfoq et al., NeurIPS 2021, the fully decentralised variant): plain tensors only.

Every client keeps its own K component models and mixture weights. In a round it runs FedEM's
E-step and weighted M-step on its own models; then each client replaces its models by a
weighted average of its graph neighbours' models, θ_i ← Σ_j W_ij θ_j, with a symmetric doubly
stochastic W (Metropolis–Hastings weights) over a seeded random connected graph. There is no
server model: the engine's cluster models are kept only as the N_i-weighted consensus of the
round's local models (for diagnostics and unseen clients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.base import ClientContext, LocalPlan, SoftMixture
from lightning_fedcluster.algorithms.protocols import PersonalMixing
from lightning_fedcluster.algorithms.seeds import DFEDEM_GRAPH, derive_seed
from lightning_fedcluster.arguments import check_seed


def random_connected_graph(num_clients: int, edge_probability: float, seed: int) -> Tensor:
    """Symmetric adjacency [M, M] (no self-loops): a ring (so the graph is connected) plus each
    other edge independently with ``edge_probability``."""
    generator = torch.Generator().manual_seed(derive_seed(seed, num_clients, DFEDEM_GRAPH))
    upper = torch.rand(num_clients, num_clients, generator=generator) < edge_probability
    adjacency = torch.triu(upper, diagonal=1)
    adjacency = adjacency | adjacency.T
    if num_clients > 1:
        ring = torch.arange(num_clients)
        adjacency[ring, (ring + 1) % num_clients] = True
        adjacency[(ring + 1) % num_clients, ring] = True
    adjacency.fill_diagonal_(False)
    return adjacency


def metropolis_weights(adjacency: Tensor) -> Tensor:
    """W_ij = 1 / (1 + max(d_i, d_j)) on edges, W_ii = 1 − Σ_{j≠i} W_ij: symmetric, doubly stochastic."""
    degree = adjacency.sum(1).to(torch.float64)
    pairwise = 1.0 / (1.0 + torch.maximum(degree.unsqueeze(0), degree.unsqueeze(1)))
    weights = torch.where(adjacency, pairwise, torch.zeros_like(pairwise))
    weights += torch.diag(1.0 - weights.sum(1))
    return weights


@dataclass(frozen=True)
class DFedEMConfig:
    """D-FedEM's options, ``DFedEM.Config``: they define the communication graph.

    Args:
        edge_probability: probability of each edge beyond the ring that keeps the graph connected.
        seed: seeds the graph (a strategy passes its ``seed``).
    """

    edge_probability: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        p = self.edge_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"edge_probability must be in [0, 1], got {p!r}")
        check_seed(self.seed)


class DFedEM(SoftMixture, PersonalMixing):
    """D-FedEM's rules; options in [`DFedEMConfig`][lightning_fedcluster.algorithms.dfedem.DFedEMConfig]
    (``DFedEM.Config``)."""

    Config = DFedEMConfig
    config: DFedEMConfig
    personal_copies = 0  # every client keeps all K models

    def __init__(self, num_clusters: int, config: DFedEMConfig | None = None, **options: Any) -> None:
        super().__init__(num_clusters, config, **options)
        self._mixing: Tensor | None = None

    def mixing_matrix(self, num_clients: int) -> Tensor:
        if self._mixing is None or self._mixing.shape[0] != num_clients:
            graph = random_connected_graph(num_clients, self.config.edge_probability, self.config.seed)
            self._mixing = metropolis_weights(graph)
        return self._mixing

    def local_plan(self, report, context: ClientContext) -> LocalPlan:  # noqa: ANN001 - see base
        plan = super().local_plan(report, context)
        return LocalPlan(clusters=plan.clusters, sample_weights=plan.sample_weights, from_personal=True)

    def mix_personal(self, personal: dict[int, Tensor], round_index: int) -> None:
        """θ_i ← Σ_j W_ij θ_j over all clients (every client takes part every round)."""
        clients = sorted(personal)
        stacked = torch.stack([personal[i] for i in clients]).to(torch.float64)
        mixing = self.mixing_matrix(max(clients) + 1)[clients][:, clients]
        mixing = mixing / mixing.sum(1, keepdim=True)  # rows of clients not yet seen are dropped
        mixed = (mixing @ stacked).to(personal[clients[0]].dtype)
        for row, i in enumerate(clients):
            personal[i] = mixed[row].clone()
