"""Exact, deterministic counts: largest-remainder apportionment, hold-out sizes, client types.

Every partitioner that must hit exact sizes (stratified hold-outs, cluster sizes, mixtures) and
the FedRC client types (a concept and a corrupted flag per client) round through here, so the
same proportions always give the same integer counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "assign_client_types",
    "authors_client_types",
    "corrupted_count",
    "held_out_count",
    "largest_remainder",
]


def largest_remainder(proportions: Sequence[float], total: int) -> np.ndarray:
    """Integer counts summing to `total`, closest to `proportions * total` (Hamilton's method).

    Ties in the remainders go to the lower index, so the result is deterministic.
    """
    p = np.asarray(proportions, dtype=float)
    if p.ndim != 1 or p.size == 0 or (p < 0).any() or p.sum() <= 0:
        raise ValueError(f"proportions must be a non-empty list of non-negative numbers, got {p}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    quotas = p / p.sum() * total
    counts = np.floor(quotas + 1e-9).astype(np.int64)
    missing = max(0, total - int(counts.sum()))
    order = np.argsort(-(quotas - counts), kind="stable")
    counts[order[:missing]] += 1
    return counts


def held_out_count(size: int, fraction: float) -> int:
    """Samples `fraction` of `size` rounds to (half up); shared so callers can pre-compute it."""
    return int(np.floor(fraction * size + 0.5))


def assign_client_types(
    num_clients: int,
    concept_proportions: Sequence[float],
    corrupt_fractions: Sequence[float],
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Give every client a concept and a corrupted flag with exact, deterministic counts.

    Concept counts are `largest_remainder(concept_proportions, num_clients)`, shuffled over
    clients; within concept c, `largest_remainder([1 - f_c, f_c], n_c)[1]` randomly chosen
    clients are corrupted. Concepts are drawn first, so changing only the corrupt fractions
    keeps every client's concept. Returns (concept int64 [M], corrupted bool [M]).
    """
    if len(corrupt_fractions) != len(concept_proportions):
        raise ValueError(
            f"corrupt_fractions has {len(corrupt_fractions)} entries but concept_proportions has "
            f"{len(concept_proportions)}: give one corrupt fraction per concept"
        )
    counts = largest_remainder(concept_proportions, num_clients)
    concept = rng.permutation(np.repeat(np.arange(counts.size), counts))
    corrupted = np.zeros(num_clients, dtype=bool)
    for c, fraction in enumerate(corrupt_fractions):
        members = np.flatnonzero(concept == c)
        n_corrupt = corrupted_count(members.size, fraction)
        corrupted[rng.choice(members, size=n_corrupt, replace=False)] = True
    return concept.astype(np.int64), corrupted


def corrupted_count(num_clients: int, fraction: float) -> int:
    """How many of `num_clients` clients of one concept `assign_client_types` corrupts."""
    if num_clients == 0:
        return 0
    return int(largest_remainder([1.0 - fraction, fraction], num_clients)[1])


def authors_client_types(num_clients: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The FedRC authors' client mix (their make_fmnist_c.py / make_cifar_c.py), three concepts.

    With a = int(0.2 M) and b = int(0.1 M), a random order of the M clients is dealt out as: a
    clients concept 0 corrupted; 2a clients alternately concept 1 and 2, clean; 2b clients
    alternately concept 1 and 2, corrupted; the rest concept 0, clean. For M = 300: concepts
    120 / 90 / 90 (40 / 30 / 30 %), of which 60 / 30 / 30 corrupted. Returns (concept int64 [M],
    corrupted bool [M]).
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
    a, b = int(0.2 * num_clients), int(0.1 * num_clients)  # 3a + 2b <= 0.8 M: the rest is clean
    alternate = np.arange(2 * a) % 2 + 1
    rest = num_clients - 3 * a - 2 * b
    concept = np.concatenate([np.zeros(a), alternate, np.arange(2 * b) % 2 + 1, np.zeros(rest)])
    corrupted = np.concatenate([np.ones(a), np.zeros(2 * a), np.ones(2 * b), np.zeros(rest)])
    order = rng.permutation(num_clients)  # order[j]: the client that takes the j-th slot
    out_concept = np.empty(num_clients, dtype=np.int64)
    out_corrupted = np.empty(num_clients, dtype=bool)
    out_concept[order] = concept
    out_corrupted[order] = corrupted.astype(bool)
    return out_concept, out_corrupted
