"""Pure partition functions: hold-outs, label-skew and mixture splits, client types, train/test.

All functions take label arrays (or client ids, source ids, sizes) and a
`numpy.random.Generator`, and return index arrays (positions into the input), so they never touch
the data itself, work for tensors and any map-style dataset alike (see `dataset_labels`), and are
reproducible: the same generator state gives the same partition.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from numbers import Integral
from typing import Any

import numpy as np

__all__ = [
    "MIXTURE_PATTERNS",
    "assign_client_types",
    "cluster_dirichlet_split",
    "cluster_n_class_split",
    "corrupted_count",
    "dataset_labels",
    "dirichlet_split",
    "held_out_count",
    "holdout_clients",
    "iid_split",
    "largest_remainder",
    "mixture_counts",
    "mixture_split",
    "mixture_weights",
    "n_class_split",
    "natural_split",
    "stratified_split",
    "stratified_subset",
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


def stratified_subset(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` sorted positions drawn without replacement, keeping every class's share (the class
    counts are `largest_remainder` of the class frequencies)."""
    labels = np.asarray(labels)
    if isinstance(size, bool) or not isinstance(size, Integral) or not 1 <= size <= labels.size:
        raise ValueError(f"size must be an integer in [1, {labels.size}], got {size!r}")
    classes, counts = np.unique(labels, return_counts=True)
    wanted = largest_remainder(counts, int(size))
    chosen = [
        rng.choice(np.flatnonzero(labels == cls), size=int(n), replace=False)
        for cls, n in zip(classes, wanted, strict=True)
    ]
    return np.sort(np.concatenate(chosen))


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
    reserve: bool = False,
) -> list[np.ndarray]:
    """Label-skew split: each class is divided among clients with proportions ~ Dir(alpha).

    Small alpha gives clients few dominant classes; large alpha approaches IID. The draw is
    repeated (at most `max_attempts` times) until every client holds `min_size` positions.
    With `reserve=True` there is no repetition: every client first receives `min_size` random
    positions, and the rest are split by the Dirichlet draw; use it when skew is so extreme
    (e.g. alpha = 0.1 over hundreds of clients) that a draw meeting `min_size` is unlikely.
    """
    labels = np.asarray(labels)
    if reserve:
        if num_clients * min_size > labels.size:
            raise ValueError(
                f"num_clients * min_size = {num_clients * min_size} exceeds the {labels.size} "
                "samples; use fewer clients or a smaller min_size"
            )
        order = rng.permutation(labels.size)
        reserved = np.split(order[: num_clients * min_size], num_clients)
        rest = order[num_clients * min_size :]
        if rest.size == 0:
            return [np.sort(part) for part in reserved]
        drawn = dirichlet_split(labels[rest], num_clients, alpha, rng, min_size=0, max_attempts=1)
        return [np.sort(np.concatenate([r, rest[d]])) for r, d in zip(reserved, drawn, strict=True)]
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


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the partitioners below.


def _count_arg(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _labels_arg(labels: Any, name: str = "labels") -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{name} must hold integer class indices, got dtype {array.dtype}; map the classes to "
            "0..C-1 first (e.g. np.unique(values, return_inverse=True)[1])"
        )
    if array.min() < 0:
        raise ValueError(f"{name} must be >= 0, found {int(array.min())}")
    return array


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def dataset_labels(dataset: Any) -> np.ndarray:
    """The label of every item of a map-style dataset, as an int64 array.

    Uses the dataset's `targets` or `labels` attribute when it has one (torchvision datasets
    do), else reads `dataset[i][1]` for every item. The result feeds any partitioner here.
    """
    for attribute in ("targets", "labels"):
        values = getattr(dataset, attribute, None)
        if values is not None and not callable(values):
            return np.asarray(values).astype(np.int64).reshape(-1)
    try:
        size = len(dataset)
    except TypeError as error:
        raise TypeError(
            f"dataset must be a map-style dataset (with __len__ and __getitem__), got "
            f"{type(dataset).__name__}"
        ) from error
    return np.asarray([int(dataset[i][1]) for i in range(size)], dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Pathological n-class splits (FedAvg) and the WeCFL cluster-wise non-IID splits.


def _balanced_class_sets(
    num_holders: int, classes: np.ndarray, per_holder: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Give each holder `per_holder` distinct classes, keeping class usage as even as possible.

    Greedy: every holder takes the least used classes so far, ties broken at random, so with
    num_holders * per_holder >= len(classes) every class is used and usage differs by <= 1.
    """
    usage = np.zeros(classes.size, dtype=np.int64)
    sets = []
    for _ in range(num_holders):
        order = rng.permutation(classes.size)
        chosen = order[np.argsort(usage[order], kind="stable")[:per_holder]]
        usage[chosen] += 1
        sets.append(np.sort(classes[chosen]))
    return sets


def _split_among_holders(
    members_by_class: dict[int, np.ndarray],
    class_sets: list[np.ndarray],
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Divide each class's members into near-equal random shares among the holders of that class."""
    parts: list[list[np.ndarray]] = [[] for _ in class_sets]
    for cls, members in members_by_class.items():
        holders = [h for h, chosen in enumerate(class_sets) if cls in chosen]
        if not holders:
            continue
        shares = np.array_split(rng.permutation(members), len(holders))
        for holder, share in zip(holders, shares, strict=True):
            parts[holder].append(share)
    empty = np.empty(0, dtype=np.int64)
    return [np.sort(np.concatenate(part + [empty])) for part in parts]


def _warn_unused(labels: np.ndarray, used: set[int], where: str) -> None:
    unused = sorted(set(np.unique(labels).tolist()) - used)
    if unused:
        dropped = int(np.isin(labels, unused).sum())
        warnings.warn(
            f"{where}: classes {unused} are held by no client, so their {dropped} samples are left "
            "out; use more clients or more classes per client to use every class",
            stacklevel=3,
        )


def n_class_split(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
    *,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Pathological non-IID split: every client holds exactly `classes_per_client` classes.

    Classes are dealt so that each is held by a near-equal number of clients, and a class's
    samples are divided evenly among its holders. If num_clients * classes_per_client is smaller
    than the number of classes, the left-over classes are dropped with a warning.
    """
    labels = _labels_arg(labels)
    num_clients = _count_arg("num_clients", num_clients)
    classes = np.unique(labels)
    classes_per_client = _count_arg("classes_per_client", classes_per_client)
    if classes_per_client > classes.size:
        raise ValueError(
            f"classes_per_client={classes_per_client} exceeds the {classes.size} classes present; "
            f"use classes_per_client <= {classes.size}"
        )
    sets = _balanced_class_sets(num_clients, classes, classes_per_client, rng)
    members = {int(c): np.flatnonzero(labels == c) for c in classes}
    parts = _split_among_holders(members, sets, rng)
    _warn_unused(labels, {int(c) for s in sets for c in s}, "n_class_split")
    _check_min_size(parts, min_size, "n_class_split", "fewer clients (num_clients)")
    return parts


def _check_min_size(parts: list[np.ndarray], min_size: int, where: str, fix: str) -> None:
    smallest = min(p.size for p in parts)
    if smallest < min_size:
        raise ValueError(
            f"{where} left a client with {smallest} < min_size={min_size} samples; use {fix} or a "
            "smaller min_size"
        )


def _cluster_sizes(num_clients: int, num_clusters: int) -> np.ndarray:
    num_clients = _count_arg("num_clients", num_clients)
    num_clusters = _count_arg("num_clusters", num_clusters)
    if num_clusters > num_clients:
        raise ValueError(
            f"num_clusters={num_clusters} exceeds num_clients={num_clients}: every cluster needs a client"
        )
    return largest_remainder(np.ones(num_clusters), num_clients)


def cluster_dirichlet_split(
    labels: np.ndarray,
    num_clients: int,
    num_clusters: int,
    rng: np.random.Generator,
    *,
    alpha: tuple[float, float] = (0.1, 10.0),
    min_size: int = 1,
) -> tuple[list[np.ndarray], np.ndarray]:
    """WeCFL's cluster-wise non-IID split "alpha = (a, b)".

    The data are first divided among `num_clusters` clusters by Dirichlet(a) label skew (large
    variance between clusters), then each cluster's data among its clients (num_clients /
    num_clusters each, near-equal) by Dirichlet(b) (small variance inside a cluster).
    Returns (parts, cluster of every client as int64 [num_clients]); clients are ordered by
    cluster.
    """
    labels = _labels_arg(labels)
    sizes = _cluster_sizes(num_clients, num_clusters)
    if (
        not isinstance(alpha, (tuple, list))
        or len(alpha) != 2
        or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0 for a in alpha)
    ):
        raise ValueError(f"alpha must be two positive numbers (between, within clusters), got {alpha!r}")
    min_size = _count_arg("min_size", min_size)
    clusters = dirichlet_split(labels, sizes.size, float(alpha[0]), rng, min_size=int(sizes.max()) * min_size)
    parts: list[np.ndarray] = []
    for members, count in zip(clusters, sizes, strict=True):
        inner = dirichlet_split(labels[members], int(count), float(alpha[1]), rng, min_size=min_size)
        parts.extend(np.sort(members[p]) for p in inner)
    return parts, np.repeat(np.arange(sizes.size), sizes).astype(np.int64)


def cluster_n_class_split(
    labels: np.ndarray,
    num_clients: int,
    num_clusters: int,
    rng: np.random.Generator,
    *,
    classes_per_cluster: int = 3,
    classes_per_client: int = 2,
    min_size: int = 1,
) -> tuple[list[np.ndarray], np.ndarray]:
    """WeCFL's cluster-wise "(3, 2)-class" split: each cluster holds `classes_per_cluster`
    classes (dealt evenly, a class's samples shared evenly among the clusters holding it) and
    each of its clients `classes_per_client` of them (again dealt and shared evenly).
    Returns (parts, cluster of every client as int64 [num_clients]); clients are ordered by
    cluster. Classes no cluster holds are dropped with a warning.
    """
    labels = _labels_arg(labels)
    sizes = _cluster_sizes(num_clients, num_clusters)
    classes = np.unique(labels)
    classes_per_cluster = _count_arg("classes_per_cluster", classes_per_cluster)
    classes_per_client = _count_arg("classes_per_client", classes_per_client)
    if classes_per_cluster > classes.size:
        raise ValueError(
            f"classes_per_cluster={classes_per_cluster} exceeds the {classes.size} classes present"
        )
    if classes_per_client > classes_per_cluster:
        raise ValueError(
            f"classes_per_client={classes_per_client} exceeds classes_per_cluster="
            f"{classes_per_cluster}: a client's classes come from its cluster's"
        )
    cluster_sets = _balanced_class_sets(sizes.size, classes, classes_per_cluster, rng)
    members = {int(c): np.flatnonzero(labels == c) for c in classes}
    cluster_parts = _split_among_holders(members, cluster_sets, rng)
    _warn_unused(labels, {int(c) for s in cluster_sets for c in s}, "cluster_n_class_split")
    parts: list[np.ndarray] = []
    for chosen, rows, count in zip(cluster_sets, cluster_parts, sizes, strict=True):
        client_sets = _balanced_class_sets(int(count), chosen, classes_per_client, rng)
        inner = {int(c): rows[labels[rows] == c] for c in chosen}
        parts.extend(_split_among_holders(inner, client_sets, rng))
    _check_min_size(parts, min_size, "cluster_n_class_split", "fewer clients (num_clients)")
    return parts, np.repeat(np.arange(sizes.size), sizes).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# FedSoft mixture partitions over S source distributions.

MIXTURE_PATTERNS: tuple[str, ...] = ("10:90", "30:70", "linear", "random")
"""The FedSoft paper's partition patterns; any "a:b" with a + b = 100 is accepted too."""


def mixture_weights(pattern: str, num_clients: int, num_sources: int, rng: np.random.Generator) -> np.ndarray:
    """Each client's share of every source distribution, float [num_clients, num_sources].

    FedSoft (Sec. 5): "a:b" (two sources): half the clients hold a% of source 0 and b% of
    source 1, the other half the reverse (which clients is random); "linear" (two sources):
    client k holds (k + 0.5) / M of source 0 (M = 100 gives the paper's (0.5 + k)%); "random"
    (any number of sources): the shares are the segments of [0, 1] cut at S - 1 Uniform(0, 1)
    points. Rows sum to 1.
    """
    num_clients = _count_arg("num_clients", num_clients)
    num_sources = _count_arg("num_sources", num_sources)
    if pattern == "random":
        cuts = np.sort(rng.uniform(0.0, 1.0, size=(num_clients, num_sources - 1)), axis=1)
        edges = np.concatenate([np.zeros((num_clients, 1)), cuts, np.ones((num_clients, 1))], axis=1)
        return np.diff(edges, axis=1)
    match = re.fullmatch(r"(\d+(?:\.\d+)?):(\d+(?:\.\d+)?)", str(pattern))
    if pattern != "linear" and (match is None or not np.isclose(float(match[1]) + float(match[2]), 100)):
        raise ValueError(
            f"pattern must be one of {', '.join(MIXTURE_PATTERNS)} (or 'a:b' with a + b = 100), "
            f"got {pattern!r}"
        )
    if num_sources != 2:
        raise ValueError(
            f"pattern={pattern!r} mixes exactly two sources but num_sources={num_sources}; use "
            "pattern='random' for more sources"
        )
    if pattern == "linear":
        first = (np.arange(num_clients) + 0.5) / num_clients
        return np.stack([first, 1.0 - first], axis=1)
    minor = float(match[1]) / 100  # type: ignore[index]
    half = largest_remainder([0.5, 0.5], num_clients)
    first = np.concatenate([np.full(half[0], minor), np.full(half[1], 1.0 - minor)])
    first = first[rng.permutation(num_clients)]
    return np.stack([first, 1.0 - first], axis=1)


def mixture_counts(weights: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Samples of each source per client, int64 [M, S]: `largest_remainder(weights[i], sizes[i])`."""
    weights = np.asarray(weights, dtype=float)
    sizes = np.asarray(sizes)
    if weights.ndim != 2 or sizes.shape != (weights.shape[0],):
        raise ValueError(
            f"weights must be [clients, sources] and sizes [clients], got {weights.shape} and {sizes.shape}"
        )
    return np.stack([largest_remainder(w, int(n)) for w, n in zip(weights, sizes, strict=True)])


def mixture_split(
    sources: np.ndarray, weights: np.ndarray, sizes: Sequence[int], rng: np.random.Generator
) -> list[np.ndarray]:
    """Draw client i's `mixture_counts(weights, sizes)[i, s]` samples from source s's pool.

    `sources[j]` is the source distribution (0..S-1) of item j. Items are drawn without
    replacement, so no item is given to two clients; a too small pool raises ValueError.
    """
    sources = _labels_arg(sources, "sources")
    counts = mixture_counts(weights, sizes)
    pools = [rng.permutation(np.flatnonzero(sources == s)) for s in range(counts.shape[1])]
    needed = counts.sum(axis=0)
    for s, (pool, need) in enumerate(zip(pools, needed, strict=True)):
        if need > pool.size:
            raise ValueError(
                f"the clients need {int(need)} samples of source {s} but it has {pool.size}; use "
                "smaller client sizes or fewer clients"
            )
    starts = np.vstack([np.zeros(counts.shape[1], dtype=np.int64), np.cumsum(counts, axis=0)])
    return [
        np.sort(np.concatenate([pools[s][starts[i, s] : starts[i + 1, s]] for s in range(counts.shape[1])]))
        for i in range(counts.shape[0])
    ]


# ---------------------------------------------------------------------------------------------
# Natural partitions and unseen clients.


def natural_split(client_ids: Any) -> list[np.ndarray]:
    """One part per distinct client id (any sortable values: ints, strings), in sorted id order."""
    ids = np.asarray(client_ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"client_ids must be a non-empty 1-D array, got shape {ids.shape}")
    _, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse))[:-1]
    return np.split(order, bounds)


def holdout_clients(
    num_clients: int, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out whole clients as unseen clients (FedEM's 80/20 is fraction=0.2).

    Returns sorted (participating, unseen) client indices; `held_out_count(M, fraction)` are
    unseen and at least one client always participates.
    """
    num_clients = _count_arg("num_clients", num_clients)
    fraction = _fraction("unseen fraction", fraction)
    n_unseen = min(held_out_count(num_clients, fraction), num_clients - 1)
    order = rng.permutation(num_clients)
    return np.sort(order[n_unseen:]), np.sort(order[:n_unseen])
