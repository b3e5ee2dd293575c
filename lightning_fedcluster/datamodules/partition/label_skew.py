"""Label-skew partitioners: IID, Dirichlet, pathological n-class and WeCFL cluster-wise splits.

Each divides label positions among clients so that clients (or clusters of clients) see
different class mixes; the cluster-wise splits reuse the n-class dealing helpers and the
Dirichlet split, so they live together here.
"""

from __future__ import annotations

import warnings

import numpy as np

from lightning_fedcluster.datamodules.partition.counts import largest_remainder
from lightning_fedcluster.datamodules.partition.inputs import count_arg, labels_arg

__all__ = [
    "cluster_dirichlet_split",
    "cluster_n_class_split",
    "dirichlet_split",
    "iid_split",
    "n_class_split",
    "prior_dirichlet_split",
]


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


def prior_dirichlet_split(
    labels: np.ndarray,
    num_clients: int,
    concentration: float,
    rng: np.random.Generator,
    *,
    size: int | None = None,
) -> list[np.ndarray]:
    """The FedRC authors' label skew: clients filled one after another, each with `size` rows.

    Client i draws class shares q ~ Dir(concentration * p), p being the class frequencies of
    the rows still unassigned, then each of its rows' class from q (renormalised over the classes
    that still have rows) and a random unassigned row of that class, without replacement. So
    `concentration` is the Dirichlet's total mass (the authors use 1.0), not a per-class alpha as
    in `dirichlet_split`. `size` defaults to len(labels) // num_clients; the remainder is unused.
    """
    labels = labels_arg(labels)
    num_clients = count_arg("num_clients", num_clients)
    if isinstance(concentration, bool) or not np.isfinite(concentration) or not concentration > 0:
        raise ValueError(f"concentration must be a positive number, got {concentration!r}")
    size = labels.size // num_clients if size is None else count_arg("size", size)
    if size == 0 or num_clients * size > labels.size:
        raise ValueError(
            f"num_clients * size = {num_clients} * {size} rows are needed but labels has {labels.size}; "
            "use fewer clients or a smaller size"
        )
    classes = np.unique(labels)
    remaining = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    parts = []
    for _ in range(num_clients):
        left = np.array([members.size for members in remaining])
        counts = _prior_dirichlet_counts(left, concentration, size, rng)
        rows = []
        for k, n in enumerate(counts):
            rows.append(remaining[k][:n])
            remaining[k] = remaining[k][n:]
        parts.append(np.sort(np.concatenate(rows)))
    return parts


def _prior_dirichlet_counts(
    left: np.ndarray, concentration: float, size: int, rng: np.random.Generator
) -> np.ndarray:
    """How many rows of each class one client takes: `size` class draws from q, a class leaving
    the draw once its rows run out (equal in law to drawing row after row and skipping empty
    classes)."""
    alive = left > 0
    q = np.zeros(left.size)
    while True:
        q[alive] = rng.dirichlet(concentration * left[alive] / left.sum())
        if np.isfinite(q).all() and q.sum() > 0:
            break
    counts = np.zeros(left.size, dtype=np.int64)
    missing = size
    while missing:
        open_ = (counts < left) & (q > 0)
        if not open_.any():  # the classes q favours are used up: the rest spread by frequency
            q = np.where(counts < left, left - counts, 0).astype(float)
            continue
        counts += rng.multinomial(missing, np.where(open_, q, 0) / q[open_].sum())
        counts = np.minimum(counts, left)
        missing = size - int(counts.sum())
    return counts


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
    labels = labels_arg(labels)
    num_clients = count_arg("num_clients", num_clients)
    classes = np.unique(labels)
    classes_per_client = count_arg("classes_per_client", classes_per_client)
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
    num_clients = count_arg("num_clients", num_clients)
    num_clusters = count_arg("num_clusters", num_clusters)
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
    labels = labels_arg(labels)
    sizes = _cluster_sizes(num_clients, num_clusters)
    if (
        not isinstance(alpha, (tuple, list))
        or len(alpha) != 2
        or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0 for a in alpha)
    ):
        raise ValueError(f"alpha must be two positive numbers (between, within clusters), got {alpha!r}")
    min_size = count_arg("min_size", min_size)
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
    labels = labels_arg(labels)
    sizes = _cluster_sizes(num_clients, num_clusters)
    classes = np.unique(labels)
    classes_per_cluster = count_arg("classes_per_cluster", classes_per_cluster)
    classes_per_client = count_arg("classes_per_client", classes_per_client)
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
