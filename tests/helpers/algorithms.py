"""Helpers of the algorithm tests (tests/algorithms/): float64 tensors, exact tolerances, client
contexts, a rule's client store and the server's view of it (what a rule's hooks receive), and the
running example that the E-step tests check by hand with plain Python ``math``."""

from __future__ import annotations

import math

import torch

from lightning_fedcluster.algorithms.base import Algorithm, ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.protocol import DiscoveryView
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView

F64 = torch.float64
TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def t(values, dtype=F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def ctx(
    omega,
    *,
    num_classes=2,
    num_samples=4,
    client=0,
    active=None,
    seen=False,
    extra=None,
    seed=0,
    membership=None,
):
    omega = torch.as_tensor(omega, dtype=F64)
    active = torch.ones(len(omega), dtype=torch.bool) if active is None else torch.tensor(active)
    return ClientContext(
        client=client,
        round_index=0,
        num_samples=num_samples,
        num_classes=num_classes,
        omega=omega,
        active=active,
        seen=seen,
        generator=torch.Generator().manual_seed(seed),
        extra=dict(extra or {}),
        membership=membership,
    )


def store(rule: Algorithm, num_clients: int, num_classes: int = 2, num_samples: int = 0) -> ClientState:
    """A fresh client store with the rule's declared entries (as the engine builds it)."""
    return ClientState.initial(num_clients, num_classes, rule.num_clusters, rule.state_entries(), num_samples)


def server_view(state: ClientState, outcome: RoundOutcome, clusters=()) -> ServerView:
    """What ``after_round`` receives: the outcome, the store and (optionally) the global models."""
    return ServerView(outcome, state, list(clusters))


def view_at(state: ClientState, round_index: int, sizes=None, clients=None, num_rounds=None) -> DiscoveryView:
    """What a discovery component's server hook receives after round ``round_index``: the store,
    every client's training size ``sizes`` (1 each by default) and the round's reporting
    ``clients`` (the seen ones by default)."""
    sizes = torch.ones(state.num_clients, dtype=torch.long) if sizes is None else torch.as_tensor(sizes)
    clients = state.seen.nonzero().flatten() if clients is None else torch.as_tensor(clients)
    outcome = RoundOutcome(round_index, clients, state.omega[clients], sizes[clients], sizes)
    return DiscoveryView(ServerView(outcome, state, []), num_rounds)


def plain_ctx(omega, num_classes, num_samples=3, client=0) -> ClientContext:
    """A context with every cluster active and nothing else set (the running example's)."""
    omega = torch.as_tensor(omega, dtype=F64)
    return ClientContext(
        client=client,
        round_index=0,
        num_samples=num_samples,
        num_classes=num_classes,
        omega=omega,
        active=torch.ones(len(omega), dtype=torch.bool),
    )


# --- the running example: 3 samples, 2 clusters, 2 classes --------------------------------------
#
# f = [[0.5, 1.5], [2.0, 0.25], [1.0, 1.0]], y = [0, 1, 1], ω = [0.7, 0.3],
# C = [[0.6, 0.2], [0.4, 0.8]] (rows: label y, columns: cluster k; each column sums to 1).
# γ_jk ∝ ω_k · exp(−f_jk) / C_{y_j,k}, e.g.
#   γ_00 = (0.7 e^−0.5 / 0.6) / (0.7 e^−0.5 / 0.6 + 0.3 e^−1.5 / 0.2)
#   γ_20 = (0.7 / 0.4) / (0.7 / 0.4 + 0.3 / 0.8) = 1.75 / 2.125 = 14/17 (equal losses cancel)

LOSSES = [[0.5, 1.5], [2.0, 0.25], [1.0, 1.0]]
LABELS = [0, 1, 1]
OMEGA = [0.7, 0.3]
C_STATS = [[0.6, 0.2], [0.4, 0.8]]

GAMMA_FEDRC = [
    [0.6788922244047344, 0.32110777559526565],
    [0.4478021355381227, 0.5521978644618774],
    [14 / 17, 3 / 17],
]
# FedEM (C ≡ 1): γ_jk ∝ ω_k exp(−f_jk); the third row is ω itself since its losses are equal.
GAMMA_FEDEM = [
    [0.8638095285778118, 0.13619047142218818],
    [0.28849552353518315, 0.7115044764648167],
    [0.7, 0.3],
]
# ω = column means of GAMMA_FEDRC.
OMEGA_FEDRC = [0.6500745905691877, 0.3499254094308124]
# S_{y,k}: label 0 is sample 0 only; label 1 is samples 1 + 2.
SUMS_FEDRC = [
    [0.6788922244047344, 0.32110777559526565],
    [0.4478021355381227 + 14 / 17, 0.5521978644618774 + 3 / 17],
]


def fixed_point_map(omega: list[float], losses, labels, stats=None) -> list[float]:
    """One E-step in plain Python: mean_j of ω_k e^{−f_jk} / C_{y_j,k}, normalised over k."""
    k_count, n = len(omega), len(losses)
    out = [0.0] * k_count
    for row, y in zip(losses, labels, strict=True):
        weights = [omega[k] * math.exp(-row[k]) / (stats[y][k] if stats else 1.0) for k in range(k_count)]
        total = sum(weights)
        for k in range(k_count):
            out[k] += weights[k] / total / n
    return out
