"""Cluster-versus-concept diagnostics on the clients × clusters weight matrix ω."""

from __future__ import annotations

import torch
from sklearn.metrics import adjusted_rand_score
from torch import Tensor


def grouping_ari(truth: Tensor, groups: Tensor) -> float:
    """Adjusted Rand index of a grouping of clients (any integer labels) against their true
    concepts: 1 = the same partition, about 0 = unrelated."""
    return float(adjusted_rand_score(truth.cpu().numpy(), groups.cpu().numpy()))


def concept_ari(omega: Tensor, concept: Tensor, seen: Tensor | None = None) -> float:
    """Adjusted Rand index between each client's cluster (argmax_k ω) and its true concept, over
    the clients that have taken part (``seen``). 1 = clusters are exactly the concepts; about 0 =
    unrelated. NaN when fewer than two clients have been seen, or when they all have one concept:
    the index then compares a clustering with a single group, which scores 0 or 1 by convention and
    says nothing (e.g. ``fedcluster fit --data FILE`` with its default ``concepts=1``)."""
    mask = torch.ones(omega.shape[0], dtype=torch.bool) if seen is None else seen.cpu()
    if int(mask.sum()) < 2 or int(concept.cpu()[mask].unique().numel()) < 2:
        return float("nan")
    return grouping_ari(concept.cpu()[mask], omega.cpu()[mask].argmax(dim=1))


def concept_shares(omega: Tensor, concept: Tensor, sizes: Tensor, num_concepts: int | None = None) -> Tensor:
    """[num_concepts, K]: for each true concept, the share of its data each cluster explains
    (Σ_i N_i ω_{i,k} over the concept's clients, normalised per concept; the paper's Fig. 3)."""
    num_concepts = int(concept.max()) + 1 if num_concepts is None else num_concepts
    weighted = omega.cpu().double() * sizes.cpu().double().unsqueeze(1)
    shares = torch.zeros(num_concepts, omega.shape[1], dtype=torch.float64)
    shares.index_add_(0, concept.cpu().long(), weighted)
    return shares / shares.sum(dim=1, keepdim=True).clamp_min(1e-12)
