"""FedRC (Guo, Tang, Lin, ICML 2024) and FedEM (Marfoq et al., NeurIPS 2021): plain tensors only.

FedRC's E-step divides each sample's likelihood by the cluster's label frequency C_{y,k}, so
clusters separate labelling rules (concepts) and not label mixes. ``use_label_stats=False`` is
FedEM (C ≡ 1). Options from the FedRC paper's appendices: Adam on γ (App. H.3), Gaussian noise
on the reported label sums (App. E), hard clustering in training (TrHC) and in prediction (TeHC).
Adaptive cluster removal (App. F) is `clusters_to_remove` plus ``ClientState.remove_clusters``.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters, ServerAction
from lightning_fedcluster.algorithms.base import (
    ClientContext,
    ClientReport,
    Contribution,
    LocalPlan,
    SoftMixture,
    soft_e_step_of_clients,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.fedrc_config import FedRCConfig
from lightning_fedcluster.algorithms.grouping import held_report
from lightning_fedcluster.algorithms.merging import CLUSTER_SCORES, client_scores, scores_entry
from lightning_fedcluster.algorithms.mixture import label_statistics, label_sums
from lightning_fedcluster.algorithms.protocols import ClientOutputs, LabelStatistics
from lightning_fedcluster.algorithms.reseed import cluster_shares, reseed_split
from lightning_fedcluster.algorithms.server_view import ClientStoreView, RoundOutcome, ServerView

# FedRC-Adam defaults (App. H.3).
ADAM_LR, ADAM_BETAS, ADAM_EPS = 1.0, (0.9, 0.99), 1e-8


class FedRC(SoftMixture, LabelStatistics, ClientOutputs):
    """FedRC's rules (and FedEM's: ``use_label_stats=False``); options in
    [`FedRCConfig`][lightning_fedcluster.algorithms.fedrc_config.FedRCConfig]
    (``FedRC.Config``), e.g. ``FedRC(3, adam_gamma=True)`` or ``FedRC(3, config=FedRC.Config(...))``."""

    Config = FedRCConfig
    config: FedRCConfig

    def __init__(self, num_clusters: int, config: FedRCConfig | None = None, **options: Any) -> None:
        super().__init__(num_clusters, config, **options)
        self.grouping = self.config.grouping
        self.release = self.config.release
        self.merging = self.config.merging
        self.retirement = self.config.retirement

    @property
    def uses_label_stats(self) -> bool:  # type: ignore[override]
        return self.config.use_label_stats

    @property
    def uses_client_outputs(self) -> bool:  # type: ignore[override]
        return self.grouping is not None

    @property
    def hard_prediction(self) -> bool:  # type: ignore[override]
        return self.config.hard_prediction

    def check_clients(self, num_clients: int) -> None:
        std = self.config.label_noise_std
        if not isinstance(std, (int, float)) and len(std) != num_clients:
            raise ValueError(
                f"label_noise_std has {len(std)} values but the datamodule has {num_clients} clients: give "
                "one σ per client, or a single σ for all"
            )

    def state_entries(self) -> tuple[StateEntry, ...]:
        """FedRC-Adam keeps each sample's γ (a mixture) and its Adam moments, and each client's
        Adam step count, between rounds; clients update and report them. Concept grouping keeps
        each client's signature (and the hold's flags), merging and the hold's release its mean
        score per cluster, the release its streak."""
        if not self.config.adam_gamma:
            grouping = () if self.grouping is None else self.grouping.state_entries()
            release = () if self.release is None else self.release.state_entries()
            scores = (scores_entry(self.num_clusters),) if self.wants_scores else ()
            return grouping + release + scores
        k = (self.num_clusters,)
        return (
            StateEntry("gamma", Scope.SAMPLE, k, reported=True, mixture=True),
            StateEntry("adam_m", Scope.SAMPLE, k, reported=True),
            StateEntry("adam_v", Scope.SAMPLE, k, reported=True),
            StateEntry("adam_steps", Scope.CLIENT, reported=True),
        )

    @property
    def wants_scores(self) -> bool:
        """Whether clients report their mean E-step score per cluster (merging, the hold's release)."""
        return self.merging is not None or self.release is not None

    def clusters_to_remove(self, state: ClientState | ClientStoreView, sizes: Tensor) -> Tensor | None:
        if self.config.removal_threshold is None:
            return None
        return clusters_to_remove(state.omega, sizes, state.seen, state.active, self.config.removal_threshold)

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """Concept grouping when it is due; a merge of near-identical clusters; the retirement of
        clusters no client owns; adaptive K (App. F): remove the clusters whose share of γ fell
        below the threshold (from round ``removal_after`` on); or, with ``reseed_threshold``,
        re-seed a dead cluster from the largest one. One decision a round, in that order; in a
        round without a grouping pass, the hold's release (streaks, releases) comes before it."""
        state, outcome = server.client_state, server.outcome
        if self.grouping is not None:
            grouped = self.grouping.actions(state, outcome.round_index)
            if grouped:
                return grouped
        released = [] if self.release is None else self.release.actions(state, outcome, self.grouping)
        return released + self._decision(state, outcome)

    def _decision(self, state: ClientStoreView, outcome: RoundOutcome) -> list[ServerAction]:
        """The round's one K decision after the grouping (see ``after_round``), or none."""
        if self.merging is not None:
            merged = self.merging.actions(state, outcome.train_sizes, outcome.round_index)
            if merged:
                return merged
        if self.retirement is not None:
            retired = self.retirement.actions(state, outcome.round_index)
            if retired:
                return retired
        if self.config.reseed_threshold is not None:
            return self._reseed(state, outcome)
        if outcome.round_index < self.config.removal_after:
            return []
        remove = self.clusters_to_remove(state, outcome.train_sizes)
        if remove is None or not bool(remove.any()):
            return []
        kept = int((state.active & ~remove).sum())
        return [
            RemoveClusters(remove),  # the store renormalises the declared mixtures (γ) with ω
            Note(
                f"round {outcome.round_index + 1}: removed cluster(s) {remove.nonzero().flatten().tolist()} "
                f"(share of γ below the threshold); {kept} remain"
            ),
        ]

    def _reseed(self, state: ClientStoreView, outcome: RoundOutcome) -> list[ServerAction]:
        assert self.config.reseed_threshold is not None
        split = reseed_split(
            state.omega,
            outcome.train_sizes,
            state.seen,
            state.active,
            self.config.reseed_threshold,
            self.config.reseed_seed,
            outcome.round_index,
        )
        if split is None:
            return []
        note = Note(
            f"round {outcome.round_index + 1}: re-seeded cluster {split.target} (share of γ below "
            f"{self.config.reseed_threshold}) from cluster {split.source}, splitting its "
            f"{split.clients.numel()} clients"
        )
        return [split, note]

    def noise_std(self, client: int) -> float:
        if isinstance(self.config.label_noise_std, (int, float)):
            return float(self.config.label_noise_std)
        return float(self.config.label_noise_std[client])

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        stats = log_label_stats if self.config.use_label_stats else None
        report = super().e_step(losses, labels, context, stats)
        if self.wants_scores:
            context.extra[CLUSTER_SCORES] = client_scores(losses, labels, stats)
        return self._client_side(report, labels, context)

    def e_step_many(
        self,
        losses: Tensor,
        labels: Tensor,
        offsets: Tensor,
        contexts: list[ClientContext],
        log_label_stats: Tensor | None,
    ) -> list[ClientReport]:
        """The batched soft E-step, then each client's Adam step and label noise (as ``e_step``)."""
        stats = log_label_stats if self.config.use_label_stats else None
        reports = soft_e_step_of_clients(losses, labels, offsets, contexts, stats)
        if self.wants_scores:
            for (a, b), context in zip(pairwise(offsets.tolist()), contexts, strict=True):
                context.extra[CLUSTER_SCORES] = client_scores(losses[a:b], labels[a:b], stats)
        bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        return [
            self._client_side(report, labels[a:b], context)
            for report, (a, b), context in zip(reports, bounds, contexts, strict=True)
        ]

    def _client_side(self, report: ClientReport, labels: Tensor, context: ClientContext) -> ClientReport:
        """What follows the soft E-step on the client: the concept signature (before the grouping),
        FedRC-Adam's γ step and the label noise."""
        grouping = self.grouping
        if (
            grouping is not None
            and context.outputs is not None
            and grouping.wants_signature(context.round_index)
        ):
            grouping.record_signature(context.outputs, labels, context.active, context.extra)
        weight = None if grouping is None else grouping.hold_weight(context.round_index, context.extra)
        if weight is not None:
            omega = context.omega.to(report.gamma)
            report = held_report(omega, context.active, labels, context.num_classes, report.gamma, weight)
        if self.config.adam_gamma:
            report = self._adam_step(report, labels, context)
        sigma = self.noise_std(context.client)
        if sigma > 0 and report.label_sums.numel():
            noise = torch.randn(report.label_sums.shape, generator=context.rng(), dtype=torch.float64)
            report = replace(report, label_sums=report.label_sums + sigma * noise.to(report.label_sums))
        return report

    def _adam_step(self, report: ClientReport, labels: Tensor, context: ClientContext) -> ClientReport:
        previous = context.extra.get("gamma")
        if previous is None or not bool((previous.sum(1) > 0).all()):  # first participation: take γ̃
            gamma = report.gamma
            m = torch.zeros_like(gamma)
            v = torch.zeros_like(gamma)
            steps = 0
        else:
            gamma, m, v = adam_gamma_step(
                previous.to(report.gamma),
                report.gamma,
                context.extra["adam_m"].to(report.gamma),
                context.extra["adam_v"].to(report.gamma),
                int(context.extra["adam_steps"]),
                context.active,
            )
            steps = int(context.extra["adam_steps"]) + 1
        new_extra = {"gamma": gamma, "adam_m": m, "adam_v": v, "adam_steps": torch.tensor(float(steps))}
        context.extra.update(new_extra)
        return ClientReport(
            gamma=gamma, omega=gamma.mean(0), label_sums=label_sums(gamma, labels, context.num_classes)
        )

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        if self.config.hard_training:
            masked = torch.where(context.active.to(report.omega.device), report.omega, -torch.inf)
            return LocalPlan(clusters=(int(torch.argmax(masked)),))
        return super().local_plan(report, context)

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        """Each trained copy into its own cluster with weight N_i (the authors'), or N_i · ω_ik from
        round ``omega_weighting_from`` on, so that a cluster moves at the rate of FedAvg over
        its own clients instead of its share of the data times it; over ``omega_weighting_ramp``
        rounds the weight goes from the one to the other, N_i · ((1 − α) + α · ω_ik), and α
        stops at ``omega_weighting_strength``."""
        start = self.config.omega_weighting_from
        if start is None or context.round_index < start:
            return super().contributions(report, plan, context)
        ramp = self.config.omega_weighting_ramp
        alpha = min(1.0, (context.round_index - start + 1) / (ramp + 1))
        alpha *= self.config.omega_weighting_strength
        omega = report.omega.tolist()
        return [
            Contribution(k, k, float(context.num_samples) * (1.0 - alpha + alpha * omega[k]))
            for k in plan.clusters
        ]

    def log_label_stats(self, state: ClientState | ClientStoreView) -> Tensor | None:
        """log C_{y,k} from the latest label sums of every client seen so far (None for FedEM)."""
        if not self.config.use_label_stats:
            return None
        # No client seen yet: all-zero sums give the uniform C, as the paper initialises it.
        return label_statistics(state.label_sums[state.seen], self.config.label_stats_floor).log()


def adam_gamma_step(
    previous: Tensor, target: Tensor, m: Tensor, v: Tensor, steps: int, active: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One Adam step on γ with gradient g = γ_prev − γ̃ (FedRC-Adam, App. H.3), then clamp at 0 and
    renormalise each sample's row over the active clusters. ``steps`` = Adam steps taken before.
    Returns (γ, m, v), all [N, K]."""
    beta1, beta2 = ADAM_BETAS
    grad = previous - target
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    t = steps + 1
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    gamma = (previous - ADAM_LR * m_hat / (v_hat.sqrt() + ADAM_EPS)).clamp_min(0)
    gamma = gamma * active.to(gamma.device)
    total = gamma.sum(1, keepdim=True)
    # A row that Adam drove to all zeros falls back to the E-step's γ̃ for that sample.
    gamma = torch.where(total > 0, gamma / total.clamp_min(torch.finfo(gamma.dtype).tiny), target)
    return gamma, m, v


def clusters_to_remove(
    omega: Tensor, sizes: Tensor, seen: Tensor, active: Tensor, threshold: float
) -> Tensor:
    """Adaptive K (FedRC App. F): active clusters whose share (1/N) Σ_{i,j} γ_{ij;k} = Σ_i N_i ω_ik / Σ_i N_i
    over the clients seen so far is below ``threshold``. Never removes the last active cluster
    (the largest share survives). Returns a [K] bool mask of clusters to remove."""
    if not bool(seen.any()):
        return torch.zeros_like(active)
    share = cluster_shares(omega, sizes, seen)
    remove = active & (share < threshold)
    if bool(remove.sum() == active.sum()):
        keep = int(torch.argmax(torch.where(active, share, torch.full_like(share, -1.0))))
        remove[keep] = False
    return remove
