"""FedSoft mixture partitions: each client draws a share of every one of S source distributions.

`mixture_weights` makes the paper's patterns ("a:b", "linear", "random"), `mixture_counts`
rounds them to exact sample counts and `mixture_split` draws the items without replacement.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from lightning_fedcluster.datamodules.partition.counts import largest_remainder
from lightning_fedcluster.datamodules.partition.inputs import count_arg, labels_arg

__all__ = ["MIXTURE_PATTERNS", "mixture_counts", "mixture_split", "mixture_weights"]


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
    num_clients = count_arg("num_clients", num_clients)
    num_sources = count_arg("num_sources", num_sources)
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
    sources = labels_arg(sources, "sources")
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
