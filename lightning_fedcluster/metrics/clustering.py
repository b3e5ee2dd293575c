"""Cluster-versus-concept diagnostics on the clients × clusters weight matrix ω."""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
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


def misplaced_clients(groups: Tensor, concept: Tensor) -> Tensor:
    """The clients [M] outside their concept's cluster, as sorted indices: concepts are matched
    one-to-one to clusters (any integer labels ``groups``) so that as many clients as possible sit
    in their concept's (Hungarian matching of the concept × cluster counts); a client in another
    cluster, or of a concept left without one (fewer clusters than concepts), is misplaced. Names
    the clients an ARI below 1 is about; ties between matchings go to scipy's first optimum."""
    if groups.is_floating_point() or concept.is_floating_point():
        raise ValueError(
            "groups and concept must be integer labels (e.g. omega.argmax(1)), got "
            f"{groups.dtype} and {concept.dtype}"
        )
    groups, concept = groups.cpu().long(), concept.cpu().long()
    if groups.shape != concept.shape or groups.dim() != 1:
        raise ValueError(
            f"groups and concept must be one-dimensional and of one length, got {tuple(groups.shape)} "
            f"and {tuple(concept.shape)}"
        )
    if groups.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    cluster_ids, cluster_of = groups.unique(return_inverse=True)
    concept_ids, concept_of = concept.unique(return_inverse=True)
    counts = torch.zeros(concept_ids.numel(), cluster_ids.numel(), dtype=torch.long)
    counts.index_put_((concept_of, cluster_of), torch.ones_like(groups), accumulate=True)
    rows, cols = linear_sum_assignment(counts.numpy(), maximize=True)
    matched = torch.full((concept_ids.numel(),), -1, dtype=torch.long)
    matched[torch.as_tensor(rows, dtype=torch.long)] = torch.as_tensor(cols, dtype=torch.long)
    return (matched[concept_of] != cluster_of).nonzero().flatten()
