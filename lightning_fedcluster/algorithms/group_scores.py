"""Which group a client belongs to, from its signature distances to the others, and which cluster
each group goes to with what ω: plain tensors only.

The concept grouping ([`grouping`][lightning_fedcluster.algorithms.discovery.grouping]) scores
each client against each group by the weighted mean distance to the group's members (each pair
weighted by the labels both hold) or by the distance to the group's medoid, refines k-medoids'
groups by the mean score, keeps the clients whose best group is clearly the best (the margin),
leaves out the groups too small to get a cluster, places the clients left out later (the late
pass), gives each group a distinct cluster (the Hungarian matching on the members' ω mass) and
its members their ω. Shapes: ``distances`` and ``weights`` [M, M] (NaN: unknown distance),
``groups`` [M] group labels, ``omega`` [M, K], ``active`` [K].
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lightning_fedcluster.algorithms.signatures import canonical_labels, fill_unknown


def mean_scores(distances: Tensor, weights: Tensor, groups: Tensor) -> Tensor:
    """Each client's score per group [M, G]: the weighted mean of its distances to the group's
    other members (weights [M, M], e.g. the labels a pair shares; pairs with weight 0 or an
    unknown distance left out); +inf for a group with no such member."""
    count = int(groups.max()) + 1
    known = ~distances.isnan()
    w = torch.where(known, weights.to(torch.float64), torch.zeros((), dtype=torch.float64))
    w = w.masked_fill(torch.eye(w.shape[0], dtype=torch.bool, device=w.device), 0.0)
    member = torch.nn.functional.one_hot(groups, count).to(torch.float64)  # [M, G]
    total = (w * torch.nan_to_num(distances.to(torch.float64), nan=0.0)) @ member
    mass = w @ member
    return torch.where(mass > 0, total / mass.clamp_min(1e-300), torch.full_like(total, torch.inf))


def mean_distance_groups(
    distances: Tensor, weights: Tensor, groups: Tensor, max_iterations: int = 100
) -> Tensor:
    """Refine a grouping [M]: move every client to the group of the lowest
    [`mean_scores`][lightning_fedcluster.algorithms.group_scores.mean_scores]
    (all at once), until nothing changes (at most ``max_iterations`` times). A client with no
    finite score keeps its group. Returns canonical labels [M]."""
    for _ in range(max_iterations):
        scores = mean_scores(distances, weights, groups)
        best = scores.argmin(1)
        moved = torch.where(scores.isfinite().any(1), best, groups)
        if torch.equal(moved, groups):
            break
        groups = canonical_labels(moved)
    return canonical_labels(groups)


def late_clusters(
    distances: Tensor, weights: Tensor, omega: Tensor, active: Tensor, grouped: Tensor
) -> Tensor:
    """The late pass's cluster [M] for each client: the alive cluster whose ``grouped`` members
    (each in its argmax-ω cluster) have the lowest
    [`mean_scores`][lightning_fedcluster.algorithms.group_scores.mean_scores] to it; -1 where no grouped
    member shares a label with it. ``distances``/``weights`` [M, M], ``omega`` [M, K], ``grouped``
    [M] bool."""
    masked = torch.where(active.to(omega.device), omega.to(torch.float64), -torch.inf)
    member_cluster = masked.argmax(1)
    votes = weights.to(torch.float64) * grouped.to(torch.float64)  # only grouped members vote
    scores = mean_scores(distances, votes, member_cluster)  # [M, up to K]
    best = scores.argmin(1)
    return torch.where(scores.isfinite().any(1), best, torch.full_like(best, -1))


def small_groups(groups: Tensor, sure: Tensor, rows: Tensor, share: float) -> Tensor:
    """[M] bool: the ``sure`` clients whose group's sure members hold less than ``share`` of all M
    clients' ``rows`` [M]."""
    sure_rows = torch.zeros(int(groups.max()) + 1, dtype=torch.float64)
    sure_rows.index_add_(0, groups[sure], rows[sure].to(torch.float64))
    return sure & (sure_rows[groups] < share * float(rows.sum()))


def medoid_scores(distances: Tensor, groups: Tensor) -> Tensor:
    """Each client's distance to each group's medoid [M, G] (the member with the least total
    distance to its group; unknown distances count as the largest known one)."""
    filled = fill_unknown(distances.to(torch.float64))
    count = int(groups.max()) + 1
    member = torch.nn.functional.one_hot(groups, count).to(torch.bool)  # [M, G]
    inside = torch.where(
        member, filled @ member.to(torch.float64), torch.full(member.shape, torch.inf, dtype=torch.float64)
    )
    medoids = inside.argmin(0)  # [G]
    return filled[:, medoids]


def confident(scores: Tensor, margin: float) -> Tensor:
    """[M] bool: the best score is below ``margin`` times the second best (a single group: all)."""
    if scores.shape[1] < 2:
        return torch.ones(scores.shape[0], dtype=torch.bool)
    two = scores.topk(2, dim=1, largest=False).values
    return two[:, 0] < margin * two[:, 1]


def cluster_omega(clusters: Tensor, active: Tensor, share: float) -> Tensor:
    """ω [n, K]: ``share`` on each client's cluster, (1 − share) spread evenly over the other alive
    clusters (all of it on the cluster when it is the only one alive)."""
    alive = active.nonzero().flatten()
    result = torch.zeros(clusters.numel(), active.numel(), dtype=torch.float64)
    if alive.numel() == 1:
        result[:, alive[0]] = 1.0
        return result
    result[:, alive] = (1 - share) / (alive.numel() - 1)
    result[torch.arange(clusters.numel()), clusters] = share
    return result


def uniform_omega(count: int, active: Tensor) -> Tensor:
    """ω [count, K]: uniform over the alive clusters."""
    omega = active.to(torch.float64).expand(count, -1).clone()
    return omega / omega.sum(1, keepdim=True)


def group_clusters(groups: Tensor, omega: Tensor, active: Tensor) -> Tensor:
    """Each grouped client's cluster [n]: each group goes to a distinct alive cluster, chosen to
    keep most of the members' current ω [n, K] mass (Hungarian matching)."""
    alive = active.nonzero().flatten()
    count = int(groups.max()) + 1
    mass = torch.zeros(count, alive.numel(), dtype=torch.float64)
    mass.index_add_(0, groups, omega[:, alive].to(torch.float64))
    rows, cols = linear_sum_assignment(mass.numpy(), maximize=True)
    cluster_of = torch.empty(count, dtype=torch.long)
    cluster_of[torch.as_tensor(rows)] = alive[torch.as_tensor(cols)]
    return cluster_of[groups]
