"""Retiring clusters that no client owns (an option of FedRC/FedEM, ``retire_after``).

FedRC's EM empties a cluster it does not need: its clients' ω drains to the others, yet the model is
still held, trained on the small γ its clients give it, checkpointed and counted in K. Merging
([`merging`][lightning_fedcluster.algorithms.discovery.merging]) never compares such a cluster,
since a pair is only compared when both clusters own a client. From round ``after`` on, after every
round the server retires every alive cluster that no seen client owns, a client owning the cluster
of its largest ω; a client whose largest ω is tied (e.g. uniform ω) owns none (``RemoveClusters``: ω
renormalised over the rest). If no seen client owns a cluster, nothing is retired, so the last
cluster always stays.

Whose is what: the rule "remove the clusters that are nobody's argmax" is the FedRC authors'
(``FedIASAggregator`` in LINs-lab/FedRC, in the spirit of HCFL+: after every round from the first,
over the clients seen so far, a tie going to the lowest index); the ``after`` round and the tie
rule (a tied client owns none, so uniform ω keeps no cluster alive by its index) are ours. FedRC's
App. F removal (``removal_threshold``) is a different test: a share of γ below δ.

[`retire_spare`][lightning_fedcluster.algorithms.discovery.retirement.retire_spare] (ours; the
grouping's ``retire``, ``group_retire``) retires, together with a concept grouping, the alive
clusters no group went to. Kept to a later retirement, such a cluster holds only the (1 − share) of
ω the grouping leaves over, and takes the samples the concept clusters fit worst; retired once those
clusters have specialised, it hands them back at once and their updates grow (K = 6 on MNIST,
``benchmarks/results/takeoff.md``). A grouping into one group retires nothing: one concept model at
full weight from the grouping on fell on one concept (same page), so K is then left to FedRC's
E-step and the later K events."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters, ServerAction
from lightning_fedcluster.algorithms.discovery.protocol import Component, DiscoveryView


@dataclass(frozen=True)
class ClusterRetirement(Component):
    """``after``: the first round (0-based) after which unowned clusters are retired. Decisive."""

    after: int
    decisive = True

    def __post_init__(self) -> None:
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise ValueError(f"retire_after must be a number of rounds >= 0, got {self.after!r}")

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """After round ``view.round_index``: retire the unowned clusters when due, else none."""
        state, round_index = view.state, view.round_index
        if round_index < self.after:
            return []
        retire = unowned_clusters(state.omega, state.seen, state.active)
        if not bool(retire.any()):
            return []
        kept = int((state.active & ~retire).sum())
        return [
            RemoveClusters(retire),
            Note(
                f"round {round_index + 1}: retired cluster(s) {retire.nonzero().flatten().tolist()} "
                f"(no client's largest ω); {kept} remain"
            ),
        ]


def cluster_owners(omega: Tensor, seen: Tensor, active: Tensor) -> Tensor:
    """[M] long: the alive cluster of each seen client's largest ω, or -1 for a client not seen or
    whose largest ω over the alive clusters is tied."""
    masked = torch.where(active, omega, torch.full_like(omega, -1.0))
    top = masked.topk(min(2, masked.shape[1]), dim=1).values
    strict = top[:, 0] > top[:, 1] if top.shape[1] > 1 else torch.ones_like(seen)
    owner = masked.argmax(1)
    return torch.where(seen & strict, owner, torch.full_like(owner, -1))


def unowned_clusters(omega: Tensor, seen: Tensor, active: Tensor) -> Tensor:
    """[K] bool: the alive clusters that no seen client owns
    ([`cluster_owners`][lightning_fedcluster.algorithms.discovery.retirement.cluster_owners]); all False
    when no seen client owns any cluster."""
    owners = cluster_owners(omega, seen, active)
    owners = owners[owners >= 0]
    if owners.numel() == 0:
        return torch.zeros_like(active)
    return alive_outside(owners, active)


def alive_outside(clusters: Tensor, active: Tensor) -> Tensor:
    """[K] bool: the alive clusters (``active`` [K]) that none of the indices ``clusters`` is."""
    named = torch.zeros_like(active)
    named[clusters] = True
    return active & ~named


def retire_spare(on: bool, clusters: Tensor, active: Tensor) -> list[ServerAction]:
    """With ``on``: remove the alive clusters (``active`` [K]) that none of the grouped clients'
    ``clusters`` [n] is, when these are at least two different clusters; else no action."""
    spare = alive_outside(clusters, active)
    taken = int(clusters.unique().numel())
    if not on or taken < 2 or not bool(spare.any()):
        return []
    return [
        RemoveClusters(spare),
        Note(
            f"concept grouping retired cluster(s) {spare.nonzero().flatten().tolist()} (no group went "
            f"to them); {taken} remain"
        ),
    ]
