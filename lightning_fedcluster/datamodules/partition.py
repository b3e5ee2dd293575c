"""Pure partition functions: stratified hold-out, label-skew splits, client types, train/test.

All functions take label arrays or sizes and a `numpy.random.Generator`, and return index
arrays (positions into the input), so they never touch the data itself and are reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "assign_client_types",
    "corrupted_count",
    "dirichlet_split",
    "held_out_count",
    "iid_split",
    "largest_remainder",
    "stratified_split",
    "train_test_split",
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


def stratified_split(
    labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split positions into (kept, held out), holding out `fraction` of every class.

    Returns sorted position arrays; per class, `held_out_count(n_class, fraction)` are held out.
    """
    labels = np.asarray(labels)
    kept: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_held = held_out_count(members.size, fraction)
        held.append(members[:n_held])
        kept.append(members[n_held:])
    empty = np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(kept + [empty])), np.sort(np.concatenate(held + [empty]))


def iid_split(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random split of `num_samples` positions into `num_clients` parts (sizes differ by <= 1)."""
    parts = np.array_split(rng.permutation(num_samples), num_clients)
    return [np.sort(part) for part in parts]


def dirichlet_split(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    min_size: int = 1,
    max_attempts: int = 100,
) -> list[np.ndarray]:
    """Label-skew split: each class is divided among clients with proportions ~ Dir(alpha).

    Small alpha gives clients few dominant classes; large alpha approaches IID. The draw is
    repeated (at most `max_attempts` times) until every client holds `min_size` positions.
    """
    labels = np.asarray(labels)
    by_class = [np.flatnonzero(labels == cls) for cls in np.unique(labels)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for _ in range(max_attempts):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for members in by_class:
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * members.size).astype(np.int64)
            for client, chunk in enumerate(np.split(rng.permutation(members), cuts)):
                parts[client].append(chunk)
        sizes = np.array([sum(chunk.size for chunk in part) for part in parts])
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(part)) for part in parts]
    raise ValueError(
        f"dirichlet_alpha={alpha} left a client with {int(sizes.min())} < min_client_size="
        f"{min_size} samples in {max_attempts} attempts ({labels.size} samples, {num_clients} "
        "clients); use fewer clients (num_clients), a larger dirichlet_alpha or a smaller "
        "min_client_size"
    )


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


def train_test_split(
    num_samples: int, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random (train, test) positions; the test part is rounded but always leaves >= 1 train."""
    n_test = min(held_out_count(num_samples, test_fraction), max(0, num_samples - 1))
    order = rng.permutation(num_samples)
    return np.sort(order[n_test:]), np.sort(order[:n_test])
