"""Re-seeding a dead cluster (an option of FedRC/FedEM, off by default and in the paper presets).

A soft-EM cluster whose share of the data falls to ~0 rarely comes back: each client's ω for it
shrinks multiplicatively, and two concepts then share one model (the main job's scenario loses
a cluster on 4 of 6 seeds). The remedy splits the largest cluster into the dead one: the dead
cluster restarts from the largest cluster's model, a seeded random half of the largest cluster's
clients (by argmax ω) move ``SPLIT_SHARE`` of their ω and label sums on it to the re-seeded
cluster, the other half ``1 − SPLIT_SHARE``. The two copies then see different client mixes, so
a merged pair of concepts drifts apart as in a 2-means split; nobody's ω on either cluster is
zero, so the E-step can still move every client back. This is a heuristic in the spirit of
HCFL's cluster splitting (Guo, Tang, Lin, ICLR 2025), not HCFL's own test.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import SplitCluster
from lightning_fedcluster.algorithms.seeds import derive_seed

RESEED_SPLIT = 0x5E1D  # seed salt of the random half
SPLIT_SHARE = 0.9  # the share of ω on the largest cluster that the chosen half moves


def cluster_shares(omega: Tensor, sizes: Tensor, seen: Tensor) -> Tensor:
    """[K] share of the seen clients' data each cluster explains: Σ_i N_i ω_ik / Σ_i N_i."""
    weights = sizes[seen].to(torch.float64)
    return (omega[seen].to(torch.float64) * weights.unsqueeze(1)).sum(0) / weights.sum()


def reseed_split(
    omega: Tensor, sizes: Tensor, seen: Tensor, active: Tensor, threshold: float, seed: int, round_index: int
) -> SplitCluster | None:
    """The split that re-seeds the emptiest active cluster whose share is below ``threshold`` from
    the largest one, or None (no dead cluster, or the largest has fewer than two clients)."""
    if int(seen.sum()) < 2:
        return None
    share = cluster_shares(omega, sizes, seen)
    dead = active & (share < threshold)
    if not bool(dead.any()):
        return None
    target = int(torch.argmin(torch.where(dead, share, torch.full_like(share, torch.inf))))
    source = int(torch.argmax(torch.where(active, share, torch.full_like(share, -1.0))))
    members = (seen & (omega.argmax(1) == source)).nonzero().flatten()
    if source == target or members.numel() < 2:
        return None
    generator = torch.Generator().manual_seed(derive_seed(seed, round_index, RESEED_SPLIT))
    order = members[torch.randperm(members.numel(), generator=generator)]
    to_target = torch.full((members.numel(),), 1 - SPLIT_SHARE, dtype=torch.float64)
    to_target[: members.numel() // 2] = SPLIT_SHARE
    return SplitCluster(target=target, source=source, clients=order, to_target=to_target)
