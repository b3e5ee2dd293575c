"""FedRC (Guo, Tang, Lin, ICML 2024) and FedEM (Marfoq et al., NeurIPS 2021): plain tensors only.

FedRC's E-step divides each sample's likelihood by the cluster's label frequency C_{y,k}, so
clusters separate labelling rules (concepts) and not label mixes. ``use_label_stats=False`` is
FedEM (C ≡ 1). Options from the FedRC paper's appendices: Adam on γ (App. H.3), Gaussian noise
on the reported label sums (App. E), hard clustering in training (TrHC) and in prediction (TeHC).
The mechanisms that find the concepts (adaptive cluster removal, App. F, among them) are
components (``algorithms/discovery``): built from ``FedRC.Config``'s options, or given
(``components=``); the rule runs their client hooks after its E-step and their server hooks
after each round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.base import (
    ClientContext,
    ClientReport,
    Contribution,
    LocalPlan,
    SoftMixture,
    soft_e_step_of_clients,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.discovery.protocol import Component
from lightning_fedcluster.algorithms.discovery.runner import RunsComponents, turn_contributions, turn_plan
from lightning_fedcluster.algorithms.fedrc_config import FedRCConfig
from lightning_fedcluster.algorithms.mixture import label_statistics, label_sums
from lightning_fedcluster.algorithms.protocols import ClientOutputs, LabelStatistics
from lightning_fedcluster.algorithms.server_view import ClientStoreView

# FedRC-Adam defaults (App. H.3).
ADAM_LR, ADAM_BETAS, ADAM_EPS = 1.0, (0.9, 0.99), 1e-8


class FedRC(RunsComponents, SoftMixture, LabelStatistics, ClientOutputs):
    """FedRC's rules (and FedEM's: ``use_label_stats=False``); options in
    [`FedRCConfig`][lightning_fedcluster.algorithms.fedrc_config.FedRCConfig]
    (``FedRC.Config``), e.g. ``FedRC(3, adam_gamma=True)`` or ``FedRC(3, config=FedRC.Config(...))``.
    ``components``: the discovery mechanisms to run instead of those the options build
    (``FedRC.Config.components()``), in their order."""

    Config = FedRCConfig
    config: FedRCConfig

    def __init__(
        self,
        num_clusters: int,
        config: FedRCConfig | None = None,
        *,
        components: Sequence[Component] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(num_clusters, config, **options)
        built = self.config.components()
        if components is not None and built:
            named = ", ".join(type(c).__name__ for c in built)
            raise ValueError(
                f"components= and FedRC.Config's mechanism options (which build {named}) were both "
                "given: pass the mechanisms one way, as components or as options"
            )
        self.use_components(built if components is None else components)

    @property
    def uses_label_stats(self) -> bool:  # type: ignore[override]
        return self.config.use_label_stats

    @property
    def uses_client_outputs(self) -> bool:  # type: ignore[override]
        return any(component.wants_outputs for component in self.components)

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
        """The components' entries (concept grouping keeps each client's signature and the hold's
        flags, merging and the hold's release its mean score per cluster, the release its streak);
        FedRC-Adam keeps each sample's γ (a mixture) and its Adam moments, and each client's Adam
        step count, between rounds; clients update and report them."""
        if not self.config.adam_gamma:
            return self.component_entries()
        k = (self.num_clusters,)
        return self.component_entries() + (
            StateEntry("gamma", Scope.SAMPLE, k, reported=True, mixture=True),
            StateEntry("adam_m", Scope.SAMPLE, k, reported=True),
            StateEntry("adam_v", Scope.SAMPLE, k, reported=True),
            StateEntry("adam_steps", Scope.CLIENT, reported=True),
        )

    def noise_std(self, client: int) -> float:
        if isinstance(self.config.label_noise_std, (int, float)):
            return float(self.config.label_noise_std)
        return float(self.config.label_noise_std[client])

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        stats = log_label_stats if self.config.use_label_stats else None
        report = super().e_step(losses, labels, context, stats)
        return self._client_side(report, losses, labels, stats, context)

    def e_step_many(
        self,
        losses: Tensor,
        labels: Tensor,
        offsets: Tensor,
        contexts: list[ClientContext],
        log_label_stats: Tensor | None,
    ) -> list[ClientReport]:
        """The batched soft E-step, then each client's side of it (as ``e_step``)."""
        stats = log_label_stats if self.config.use_label_stats else None
        reports = soft_e_step_of_clients(losses, labels, offsets, contexts, stats)
        bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        return [
            self._client_side(report, losses[a:b], labels[a:b], stats, context)
            for report, (a, b), context in zip(reports, bounds, contexts, strict=True)
        ]

    def _client_side(
        self,
        report: ClientReport,
        losses: Tensor,
        labels: Tensor,
        stats: Tensor | None,
        context: ClientContext,
    ) -> ClientReport:
        """What follows the soft E-step on the client: FedRC-Adam's γ step, the components' client
        hooks, then the label noise on what the client reports."""
        if self.config.adam_gamma:
            report = self._adam_step(report, labels, context)
        report = self.run_components(report, losses, labels, stats, context)
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
        chosen = turn_plan(report)
        if chosen is not None:
            return chosen
        if self.config.hard_training:
            masked = torch.where(context.active.to(report.omega.device), report.omega, -torch.inf)
            return LocalPlan(clusters=(int(torch.argmax(masked)),))
        return super().local_plan(report, context)

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        """Each trained copy into its own cluster with weight N_i (the authors'), or N_i · m_k with
        the multipliers a component set (the ω weighting's)."""
        weighed = turn_contributions(report, plan, context)
        return super().contributions(report, plan, context) if weighed is None else weighed

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
