"""The measured signals that fire concept discovery's decisions (pure tensors, no state).

Each trigger of [`ConceptDiscovery`][lightning_fedcluster.algorithms.discovery.policy.ConceptDiscovery]
reads one of these instead of a round number:

- **Separation of a partition**: the mean silhouette of a grouping of clients on a distance
  matrix (1: every client far closer to its own group than to the next; 0: no structure).
  ``best_partition`` tries 2..G groups and keeps the clearest, so the number of groups is measured,
  not given.
- **Stability of a partition**: the adjusted Rand index of this round's grouping against the
  previous round's over the clients both group (1: the same partition, relabelled or not).
- **Relative fit**: a client's mean score per cluster (mean −loss − log C per sample, the E-step's
  own numbers) minus the median over the reporting clients of that cluster's score. A model that
  fits every client better (a generic model early in training) gains nobody a margin; a model that
  fits one concept's clients and not the others' does.
- **Churn**: the share of clients whose cluster changed since they last reported.
"""

from __future__ import annotations

import torch
from sklearn.metrics import adjusted_rand_score
from torch import Tensor

from lightning_fedcluster.algorithms.signatures import fill_unknown, k_medoids


def silhouette(distances: Tensor, groups: Tensor) -> float:
    """Mean silhouette of ``groups`` [M] on ``distances`` [M, M] (unknown distances count as the
    largest known; a distance below 0, the rounding of 1 − cos of two equal rows, counts as 0, or
    a client's score could leave [−1, 1]). A client alone in its group scores 0 (Rousseeuw's
    convention); a single group scores 0."""
    matrix = fill_unknown(distances.to(torch.float64)).clamp_min(0.0).cpu()
    groups = groups.cpu()
    labels = groups.unique()
    if labels.numel() < 2:
        return 0.0
    m = matrix.shape[0]
    means = torch.stack([_mean_to(matrix, groups == g, exclude_self=True) for g in labels], 1)  # [M, G]
    own = (groups[:, None] == labels[None, :]).to(torch.long).argmax(1)
    rows = torch.arange(m)
    inside = means[rows, own]
    others = means.clone()
    others[rows, own] = torch.inf
    nearest = others.min(1).values
    sizes = torch.bincount(own, minlength=labels.numel())[own]
    scale = torch.maximum(inside, nearest)
    score = torch.where(scale > 0, (nearest - inside) / scale.clamp_min(1e-300), torch.zeros_like(scale))
    score = torch.where(sizes > 1, score, torch.zeros_like(score))
    return float(score.mean())


def _mean_to(matrix: Tensor, members: Tensor, exclude_self: bool) -> Tensor:
    """Each client's mean distance [M] to the ``members`` (itself left out)."""
    total = matrix[:, members].sum(1)
    count = members.to(torch.float64).sum().expand(matrix.shape[0]).clone()
    if exclude_self:
        total = total - torch.where(members, matrix.diagonal(), torch.zeros_like(total))
        count = count - members.to(torch.float64)
    return total / count.clamp_min(1.0)


def best_partition(distances: Tensor, max_groups: int, seed: int = 0) -> tuple[Tensor, float]:
    """The clearest k-medoids partition of the clients into 2..``max_groups`` groups: the labels [M]
    and its silhouette (ties: fewer groups). Fewer than three clients or ``max_groups`` < 2:
    one group, silhouette 0."""
    m = distances.shape[0]
    if m < 3 or max_groups < 2:
        return torch.zeros(m, dtype=torch.long), 0.0
    best_labels, best_score = torch.zeros(m, dtype=torch.long), 0.0
    for count in range(2, min(max_groups, m - 1) + 1):
        labels, _ = k_medoids(distances, count, seed=seed)
        score = silhouette(distances, labels)
        if score > best_score + 1e-12:
            best_labels, best_score = labels, score
    return best_labels, best_score


def partition_agreement(first: Tensor, second: Tensor) -> float:
    """Adjusted Rand index of two groupings [M] of the same clients (1: the same partition)."""
    if first.numel() < 2:
        return 1.0
    return float(adjusted_rand_score(first.cpu().numpy(), second.cpu().numpy()))


def relative_fit(scores: Tensor, active: Tensor, median_share: float | Tensor = 1.0) -> Tensor:
    """Each client's relative fit per alive cluster [n, K]: its mean score under cluster k minus
    ``median_share`` times the median over the n clients of cluster k's score (1: the fit relative
    to the other clients; 0: the score itself; a [n, 1] tensor: one share per client); −inf on
    dead clusters."""
    scores = scores.to(torch.float64)
    centred = scores - median_share * scores.quantile(0.5, dim=0)  # the median (mean of the middle two)
    return torch.where(active.to(scores.device), centred, torch.full_like(centred, -torch.inf))


def fit_margins(scores: Tensor, active: Tensor, median_share: float | Tensor = 1.0) -> tuple[Tensor, Tensor]:
    """Per client: the alive cluster of its best relative fit [n] (``relative_fit`` with
    ``median_share``) and by how much (nats per sample) it beats the second best [n] (+inf with one
    alive cluster)."""
    fit = relative_fit(scores, active, median_share)
    if int(active.sum()) < 2:
        return fit.argmax(1), torch.full((fit.shape[0],), torch.inf, dtype=torch.float64)
    top = fit.topk(2, dim=1)
    return top.indices[:, 0], top.values[:, 0] - top.values[:, 1]


def churn(previous: Tensor, current: Tensor) -> float:
    """The share of clients whose cluster changed ([n] each; a previous value < 0 means none yet
    and counts as changed)."""
    if previous.numel() == 0:
        return 0.0
    return float(((previous != current) | (previous < 0)).to(torch.float64).mean())
