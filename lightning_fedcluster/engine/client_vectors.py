"""Per-client model vectors: personal models (FedSoft, D-FedEM) that start a client's training,
the flat vector the server receives after a round (``vector_kind``), and the distances of a
trained copy to every global model (FeSEM/WeCFL). Personal models live on the CPU in the
client store; the working copies hold one client's at a time."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.base import Algorithm, ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.client import ClientWork
from lightning_fedcluster.engine.copies import ClusterCopies

VectorKind = Literal["personal", "model", "update"]


def personal_copies(rule: Algorithm, num_clusters: int) -> range:
    """The working copies a personal model occupies: copy 0 (FedSoft) or all K (D-FedEM)."""
    copies = rule.capabilities.personal_copies
    return range(copies if copies else num_clusters)


def vector_kind(rule: Algorithm, state: ClientState | None) -> VectorKind | None:
    """Which flat vector of each client the server receives after a round: "personal" (a rule
    with personal models: they are kept in the server's store), else what the rule's
    ``after_round`` reads (``round_vectors``: "model", "update" or None)."""
    return "personal" if rule.capabilities.personal_models else rule.round_vectors(state)


def load_personal(
    copies: ClusterCopies,
    rule: Algorithm,
    state: ClientState,
    global_clusters: list[list[Tensor]],
    client: int,
    context: ClientContext,
) -> None:
    """The trained copies start from the client's personal model(s); the first time, from the
    global model(s) the rule picks."""
    stored = state.personal.get(client)
    ranks = personal_copies(rule, copies.num_clusters)
    if stored is not None:
        copies.write_vector(stored, ranks)
        return
    for k in ranks:
        source = rule.initial_personal_cluster(context) if len(ranks) == 1 else k
        copies.load_cluster(k, global_clusters[source])


def vector_size(copies: ClusterCopies, rule: Algorithm, state: ClientState | None) -> int:
    """Length of the per-client vector the rule asks for this round (0: none)."""
    kind = vector_kind(rule, state)
    if kind is None:
        return 0
    ranks = personal_copies(rule, copies.num_clusters) if kind == "personal" else [0]
    return sum(t.numel() for k in ranks for t in copies.cluster_tensors(k))


def round_vector(
    copies: ClusterCopies,
    rule: Algorithm,
    state: ClientState | None,
    global_clusters: list[list[Tensor]],
    work: ClientWork,
) -> Tensor:
    """The client's flat vector: personal model(s), the trained copy, or its update."""
    kind = vector_kind(rule, state)
    if kind == "personal":
        return copies.read_vector(personal_copies(rule, copies.num_clusters))
    k = work.plan.clusters[0]
    local = copies.read_vector([k])
    if kind == "update":
        local = local - torch.cat([g.flatten().float() for g in global_clusters[k]])
    return local


def distances(copies: ClusterCopies, rule: Algorithm, global_clusters: list[list[Tensor]], k: int) -> Tensor:
    """‖g − G_j‖² [K] between trained copy k's representation (``rule.representation_mask``) and
    every global model j."""
    names = copies.parameter_names(k)
    keep = rule.representation_mask(names)
    local = copies.cluster_tensors(k)[: len(names)]
    result = torch.zeros(copies.num_clusters, dtype=torch.float64)
    for j in range(copies.num_clusters):
        reference = global_clusters[j][: len(names)]
        result[j] = sum(
            float((p.detach() - r).double().square().sum())
            for p, r, use in zip(local, reference, keep, strict=True)
            if use
        )
    return result
