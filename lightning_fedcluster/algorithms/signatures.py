"""Client signatures for grouping clients by concept: plain tensors only.

A concept is a labelling rule P(y | x). Seen through one model, clients of the same concept show
the same class-conditional picture: for each label y they hold, the model's mean prediction over
their rows labelled y (a row of a C × C "confusion" matrix). A concept shift (e.g. a label
permutation) moves those rows, often their argmax; a label shift only removes rows (the client
lacks some labels), so two clients are compared on the labels both hold; a feature shift mostly
blurs the rows. This is the output-space analogue of the per-class feature prototypes of the
FedRC authors' FedIAS code (LINs-lab/FedRC), which compares clients by per-class mean features.

Shapes: ``values`` [N, D] per-sample vectors (e.g. the K models' class probabilities, flattened
to K·C), ``labels`` [N], ``means`` [M, C, D] and ``counts`` [M, C] for M clients.
"""

from __future__ import annotations

import torch
from sklearn.cluster import AgglomerativeClustering
from torch import Tensor

MIN_ROWS = 1  # a label counts as held when a client has at least this many rows of it


def label_conditioned_means(values: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per label y, the mean of ``values`` [N, D] over the rows labelled y, and the row counts.
    Returns means [C, D] (zero rows for labels not held) and counts [C] (float64)."""
    values = values.to(torch.float64)
    sums = torch.zeros(num_classes, values.shape[1], dtype=torch.float64, device=values.device)
    sums.index_add_(0, labels, values)
    counts = torch.bincount(labels, minlength=num_classes).to(sums)
    return sums / counts.clamp_min(1).unsqueeze(1), counts


def client_signature(
    outputs: Tensor, labels: Tensor, active: Tensor, num_classes: int
) -> tuple[Tensor, Tensor]:
    """A client's signature from the K models' outputs [K, N, C] on its rows: per label, the mean
    over its rows of that label of the alive models' mean prediction. Returns [C, C] and counts [C]."""
    probs = outputs[active.to(outputs.device)].to(torch.float64).mean(0)
    return label_conditioned_means(probs, labels, num_classes)


def signature_distances(
    means: Tensor, counts: Tensor, min_rows: int = MIN_ROWS, metric: str = "cosine"
) -> tuple[Tensor, Tensor]:
    """Pairwise distances of M clients' signatures: for clients i and l, the mean over the labels
    both hold (>= ``min_rows`` rows each) of a distance of their label-conditioned means:
    ``"cosine"``: 1 − cos of the rows centred on their own mean (in [0, 2]; blind to how confident
    the model is, so an early, nearly uniform model still separates concepts); ``"tv"``: half the
    L1 distance (the total-variation distance of probability rows).

    Returns distances [M, M] (float64, 0 on the diagonal) and a [M, M] bool mask of the pairs that
    share at least one label; a pair that shares none has distance NaN (the caller decides)."""
    held = counts >= min_rows  # [M, C]
    common = held.unsqueeze(1) & held.unsqueeze(0)  # [M, M, C]
    if metric == "cosine":
        centred = means - means.mean(-1, keepdim=True)
        unit = centred / centred.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(centred.dtype).tiny)
        per_label = 1.0 - (unit.unsqueeze(1) * unit.unsqueeze(0)).sum(-1)  # [M, M, C]
    elif metric == "tv":
        per_label = 0.5 * (means.unsqueeze(1) - means.unsqueeze(0)).abs().sum(-1)  # [M, M, C]
    else:
        raise ValueError(f"metric must be 'cosine' or 'tv', got {metric!r}")
    shared = common.sum(-1)
    total = (per_label * common).sum(-1)
    distances = torch.where(shared > 0, total / shared.clamp_min(1), torch.full_like(total, torch.nan))
    distances.fill_diagonal_(0.0)
    return distances, shared > 0


def fill_unknown(distances: Tensor) -> Tensor:
    """Distances with NaN (pairs that share no label) replaced by the largest known distance: a
    pair that cannot be compared is treated as different, never merged on no evidence."""
    known = distances[~distances.isnan()]
    ceiling = float(known.max()) if known.numel() else 1.0
    return torch.nan_to_num(distances, nan=ceiling)


def group_clients(
    distances: Tensor,
    *,
    num_groups: int | None = None,
    threshold: float | None = None,
    linkage: str = "complete",
) -> Tensor:
    """Agglomerative clustering of clients on a precomputed distance matrix [M, M]: into
    ``num_groups`` groups, or cutting the tree at ``threshold`` (exactly one must be given).
    Groups are numbered by their first member (client order), so equal inputs give equal labels.
    Returns labels [M] (long)."""
    if (num_groups is None) == (threshold is None):
        raise ValueError("group_clients needs exactly one of num_groups and threshold")
    m = distances.shape[0]
    if m == 1 or (num_groups is not None and num_groups <= 1):
        return torch.zeros(m, dtype=torch.long)
    if num_groups is not None and num_groups >= m:
        return torch.arange(m)
    matrix = fill_unknown(distances.to(torch.float64)).clamp_min(0).cpu().numpy()
    model = AgglomerativeClustering(
        n_clusters=num_groups, distance_threshold=threshold, metric="precomputed", linkage=linkage
    )
    raw = torch.as_tensor(model.fit(matrix).labels_)
    return canonical_labels(raw)


def k_medoids(
    distances: Tensor, num_groups: int, *, restarts: int = 10, seed: int = 0
) -> tuple[Tensor, float]:
    """Partition M clients into ``num_groups`` groups around medoids (clients), minimising the sum
    of each client's distance to its group's medoid: k-means++ seeding (seeded), then alternate
    assignment and medoid update until nothing changes; the best of ``restarts`` seedings.
    Partitional, so one far-off client (a corrupted one) does not take a group of its own as it
    does in complete linkage. Returns labels [M] (canonical order) and the total cost."""
    matrix = fill_unknown(distances.to(torch.float64)).clamp_min(0).cpu()
    m = matrix.shape[0]
    if num_groups >= m:
        return torch.arange(m), 0.0
    generator = torch.Generator().manual_seed(seed)
    best: tuple[float, Tensor] | None = None
    for _ in range(restarts):
        medoids = [int(torch.randint(m, (1,), generator=generator))]
        for _ in range(num_groups - 1):
            nearest = matrix[:, medoids].min(1).values.square()
            if float(nearest.sum()) <= 0:
                nearest = torch.ones(m, dtype=torch.float64)
                nearest[medoids] = 0
            medoids.append(int(torch.multinomial(nearest, 1, generator=generator)))
        for _ in range(100):
            labels = matrix[:, medoids].argmin(1)
            updated = []
            for g, medoid in enumerate(medoids):
                members = (labels == g).nonzero().flatten()
                if members.numel() == 0:
                    updated.append(medoid)
                    continue
                inside = matrix[members][:, members].sum(1)
                updated.append(int(members[int(inside.argmin())]))
            if updated == medoids:
                break
            medoids = updated
        labels = matrix[:, medoids].argmin(1)
        cost = float(matrix[torch.arange(m), torch.tensor(medoids)[labels]].sum())
        if best is None or cost < best[0] - 1e-12:
            best = (cost, labels)
    assert best is not None
    return canonical_labels(best[1]), best[0]


def canonical_labels(labels: Tensor) -> Tensor:
    """Relabel groups 0, 1, ... in the order of their first member."""
    order: dict[int, int] = {}
    for value in labels.tolist():
        order.setdefault(int(value), len(order))
    return torch.tensor([order[int(v)] for v in labels.tolist()], dtype=torch.long)
