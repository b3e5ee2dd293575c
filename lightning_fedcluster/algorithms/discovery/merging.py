"""Merging near-identical clusters (an option of FedRC/FedEM; ours, not the papers').

Two clusters that hold the same concept (a concept split over two groups by concept grouping, or
K chosen too large) train two models of one labelling rule: their members' data fit either model
about equally well, so the E-step cannot move them and each model sees only part of the concept's
data. Each client reports, with its E-step, its mean log-likelihood per sample under every cluster,
s_ik = (1/N_i) Σ_j (−f_jk − log C_{y_j,k}) (the E-step's own scores, prior left out). From round
``after`` on, after every round the server looks at every pair of alive clusters k, l and the
seen clients whose largest ω is k or l, and computes the gap g_kl = Σ_i N_i |s_ik − s_il| / Σ_i N_i.
The pair with the smallest gap merges when g_kl < ``threshold`` (nats per sample): the cluster
that explains less of the data is retired into the other (``MergeClusters``: its clients' ω and
label sums move there), whose model is kept (two models from independent starts cannot be
averaged). One merge per round.

Clusters of different concepts differ by several nats per sample once they have specialised
(a model of another labelling rule puts little probability on the client's labels); a merge
tests the hypothesis that one model explains both clusters' clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import MergeClusters, Note, ServerAction
from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    Component,
    DiscoveryView,
    cluster_shares,
)
from lightning_fedcluster.algorithms.discovery.runner import rule_option


@dataclass(frozen=True)
class ClusterMerging(Component):
    """``threshold``: merge when the members' mean log-likelihood gap is below this (nats per
    sample); ``after``: the first round (0-based) after which merges are considered. Decisive (a
    K decision); reads each client's mean E-step score per cluster."""

    threshold: float
    after: int = 0
    decisive = True
    wants_scores = True

    def __post_init__(self) -> None:
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, (int, float))
            or self.threshold <= 0
        ):
            raise ValueError(f"merge_threshold must be > 0 (nats per sample), got {self.threshold!r}")
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise ValueError(f"merge_after must be a number of rounds >= 0, got {self.after!r}")

    def check(self, rule: Any) -> None:
        if rule_option(rule, "adam_gamma"):
            raise ValueError(
                "merging cannot be combined with adam_gamma (a merge would have to move each sample's "
                "γ too): use one or the other"
            )

    def actions(self, view: DiscoveryView) -> list[ServerAction]:
        """After round ``view.round_index``: the merge of the closest pair when due, else none."""
        round_index, state, sizes = view.round_index, view.state, view.outcome.train_sizes
        if round_index < self.after:
            return []
        found = closest_pair(state.omega, state.extra[CLUSTER_SCORES], sizes, state.seen, state.active)
        if found is None or found[0] >= self.threshold:
            return []
        gap, first, second = found
        share = cluster_shares(state.omega, sizes, state.seen)
        target, source = (first, second) if float(share[first]) >= float(share[second]) else (second, first)
        return [
            MergeClusters(target=target, source=source),
            Note(
                f"round {round_index + 1}: merged cluster {source} into cluster {target} (their members' "
                f"log-likelihood gap {gap:.3f} nats per sample is below {self.threshold})"
            ),
        ]


def pair_gaps(
    omega: Tensor, scores: Tensor, sizes: Tensor, seen: Tensor, active: Tensor
) -> dict[tuple[int, int], float]:
    """g_kl for every pair k < l of alive clusters that some seen client's largest ω points to:
    the N_i-weighted mean of |s_ik − s_il| over the seen clients whose largest ω is k or l."""
    masked = torch.where(active, omega, torch.full_like(omega, -1.0))
    owner = masked.argmax(1)
    weights = sizes.to(torch.float64)
    alive = [int(k) for k in active.nonzero().flatten()]
    gaps = {}
    for a, k in enumerate(alive):
        for m in alive[a + 1 :]:
            members = seen & ((owner == k) | (owner == m))
            if not bool((seen & (owner == k)).any()) or not bool((seen & (owner == m)).any()):
                continue
            w = weights[members]
            gap = (w * (scores[members, k] - scores[members, m]).abs()).sum() / w.sum()
            gaps[(k, m)] = float(gap)
    return gaps


def closest_pair(
    omega: Tensor, scores: Tensor, sizes: Tensor, seen: Tensor, active: Tensor
) -> tuple[float, int, int] | None:
    """(g_kl, k, l) of the pair with the smallest gap (lowest indices on ties), or None."""
    gaps = pair_gaps(omega, scores, sizes, seen, active)
    if not gaps:
        return None
    (k, m), gap = min(gaps.items(), key=lambda item: (item[1], item[0]))
    return gap, k, m
