"""FedRC (Guo, Tang, Lin, ICML 2024) and FedEM (Marfoq et al., NeurIPS 2021): plain tensors only.

FedRC's E-step divides each sample's likelihood by the cluster's label frequency C_{y,k}, so
clusters separate labelling rules (concepts) and not label mixes. ``use_label_stats=False`` is
FedEM (C ≡ 1). Options from the FedRC paper's appendices: Adam on γ (App. H.3), Gaussian noise
on the reported label sums (App. E), hard clustering in training (TrHC) and in prediction (TeHC).
Adaptive cluster removal (App. F) is :func:`clusters_to_remove` plus ``ClientState.remove_clusters``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters, ServerAction
from lightning_fedcluster.algorithms.base import (
    ClientContext,
    ClientReport,
    LocalPlan,
    SoftMixture,
    soft_e_step_of_clients,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.grouping import ConceptGrouping, held_report
from lightning_fedcluster.algorithms.merging import CLUSTER_SCORES, ClusterMerging, client_scores
from lightning_fedcluster.algorithms.mixture import LABEL_STATS_FLOOR, label_statistics, label_sums
from lightning_fedcluster.algorithms.protocols import ClientOutputs, LabelStatistics
from lightning_fedcluster.algorithms.reseed import cluster_shares, reseed_split
from lightning_fedcluster.algorithms.server_view import ClientStoreView, RoundOutcome, ServerView

# FedRC-Adam defaults (App. H.3).
ADAM_LR, ADAM_BETAS, ADAM_EPS = 1.0, (0.9, 0.99), 1e-8


@dataclass(frozen=True)
class FedRCConfig:
    """FedRC's (and FedEM's) options, ``FedRC.Config``: defaults, checks and docs in one place.

    Args:
        use_label_stats: divide by C_{y,k} (FedRC); False gives FedEM (C ≡ 1; works for regression).
        hard_prediction: predict with the argmax-ω model only (TeHC) instead of the ω-mixture.
        hard_training: train only the argmax-ω model, every sample with weight 1 (TrHC; it hurts,
            paper Table 15: ablations only).
        adam_gamma: FedRC-Adam (App. H.3): Adam steps on γ with g = γ_prev − γ_E-step, γ kept per
            sample between rounds.
        label_noise_std: σ_i of the Gaussian noise each client adds to its label sums (privacy,
            App. E); one value for all clients, or one per client.
        removal_threshold: δ of adaptive K (App. F, e.g. 0.05): start with a generous
            ``num_clusters`` and, after each round, remove clusters whose share of γ over all seen
            clients' data is below δ (None: never).
        label_stats_floor: the smallest C_{y,k} the E-step divides by (the authors' 1e-8). A
            cluster that holds almost no rows of label y otherwise pulls every label-y sample of
            every client towards itself by up to 1/floor, which breaks up concept clusters whose
            clients lack some labels (strong label skew, few clients per cluster); e.g. 0.01 caps
            the pull at 100x.
        reseed_threshold: a remedy for dead clusters, off by default and in the paper presets
            (e.g. 0.05): after a round, the emptiest cluster whose share of γ is below it restarts
            as a copy of the largest cluster, which hands it a seeded random half of its clients
            (:mod:`.reseed`); a server optimizer restarts its state for the re-seeded cluster. Not
            with ``removal_threshold`` or ``adam_gamma``.
        reseed_seed: seeds the random half of clients a re-seeding moves (a strategy passes its
            ``seed``).
        group_round: concept grouping, a take-off mechanism (:mod:`.grouping`, ours; off by
            default and in the paper presets): in the rounds before it, clients compute a
            label-conditioned prediction signature in their E-step; after round ``group_round``
            the server groups them by k-medoids and gives each group's clients ω ``group_share``
            on one cluster (docs: "How clusters form").
        group_share: the grouped clients' ω on their group's cluster (needs ``group_round``).
        group_assign: "medoid" (k-medoids' groups, the default) or "mean": each client then moves
            to the group whose members are closest on average, weighted by the labels the two
            share, which keeps clients with noisy signatures (corrupted images, few shared
            labels) from dragging a group (:mod:`.grouping`; needs ``group_round``).
        group_margin: e.g. 0.7: group only the clients whose best group score is below this
            times the second best; the others get uniform ω and FedRC's E-step places them
            (None: group every client; needs ``group_round``).
        group_hold: e.g. 5: for this many rounds after the grouping, a grouped client gives
            every sample γ = its ω, so that each concept's cluster learns all of the concept's
            labels before FedRC's E-step may move samples again (0: never; needs ``group_round``).
        group_late_round: e.g. 20, with ``group_margin``: after this many rounds, each client the
            margin left ungrouped goes to the cluster whose grouped clients' signatures are
            closest on average, and is held for ``group_hold`` rounds (:mod:`.grouping`; None:
            FedRC's E-step places them; needs ``group_round``).
        merge_threshold: merging (:mod:`.merging`, ours): from round ``merge_after`` on, retire one
            of the two clusters whose members' mean log-likelihood per sample differs least
            between them, when that gap is below this (nats); None: never. With grouping,
            ``num_clusters`` is then an upper bound on K.
        merge_after: the first round index after which a merge may happen (needs
            ``merge_threshold``).
    """

    use_label_stats: bool = True
    hard_prediction: bool = False
    hard_training: bool = False
    adam_gamma: bool = False
    label_noise_std: float | tuple[float, ...] = 0.0
    removal_threshold: float | None = None
    label_stats_floor: float = LABEL_STATS_FLOOR
    reseed_threshold: float | None = None
    reseed_seed: int = 0
    group_round: int | None = None
    group_share: float = 0.9
    group_assign: str = "medoid"
    group_margin: float | None = None
    group_hold: int = 0
    group_late_round: int | None = None
    merge_threshold: float | None = None
    merge_after: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.label_noise_std, (int, float)):  # one σ per client: kept as a tuple
            object.__setattr__(self, "label_noise_std", tuple(self.label_noise_std))
        check_options(
            self.use_label_stats,
            self.label_noise_std,
            self.removal_threshold,
            self.reseed_threshold,
            self.adam_gamma,
        )
        floor = self.label_stats_floor
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < 1:
            raise ValueError(f"label_stats_floor must be in (0, 1) (the authors' 1e-8), got {floor!r}")
        for name, on in (
            ("group_round", self.group_round is not None),
            ("merge_threshold", self.merge_threshold is not None),
        ):
            if on and self.adam_gamma:
                raise ValueError(f"{name} cannot be combined with adam_gamma: use one or the other")
        for name, value, default, needs, on in (
            ("group_share", self.group_share, 0.9, "group_round", self.group_round is not None),
            ("group_assign", self.group_assign, "medoid", "group_round", self.group_round is not None),
            ("group_margin", self.group_margin, None, "group_round", self.group_round is not None),
            ("group_hold", self.group_hold, 0, "group_round", self.group_round is not None),
            ("group_late_round", self.group_late_round, None, "group_round", self.group_round is not None),
            ("merge_after", self.merge_after, 0, "merge_threshold", self.merge_threshold is not None),
        ):
            if not on and value != default:
                raise ValueError(
                    f"{name}={value!r} has no effect without {needs}: set {needs} too, or drop it"
                )
        self.grouping, self.merging  # noqa: B018 - their own checks of group_*/merge_* values

    @property
    def grouping(self) -> ConceptGrouping | None:
        """Concept grouping as configured (None: off)."""
        if self.group_round is None:
            return None
        return ConceptGrouping(
            self.group_round,
            self.group_share,
            self.group_assign,
            self.group_margin,
            self.group_hold,
            self.group_late_round,
        )

    @property
    def merging(self) -> ClusterMerging | None:
        """Cluster merging as configured (None: off)."""
        return (
            None if self.merge_threshold is None else ClusterMerging(self.merge_threshold, self.merge_after)
        )


class FedRC(SoftMixture, LabelStatistics, ClientOutputs):
    """FedRC's rules (and FedEM's: ``use_label_stats=False``); options in :class:`FedRCConfig`
    (``FedRC.Config``), e.g. ``FedRC(3, adam_gamma=True)`` or ``FedRC(3, config=FedRC.Config(...))``."""

    Config = FedRCConfig
    config: FedRCConfig

    def __init__(self, num_clusters: int, config: FedRCConfig | None = None, **options: Any) -> None:
        super().__init__(num_clusters, config, **options)
        self.grouping = self.config.grouping
        self.merging = self.config.merging

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
        each client's signature, merging its mean score per cluster."""
        if not self.config.adam_gamma:
            grouping = () if self.grouping is None else self.grouping.state_entries()
            merging = () if self.merging is None else self.merging.state_entries(self.num_clusters)
            return grouping + merging
        k = (self.num_clusters,)
        return (
            StateEntry("gamma", Scope.SAMPLE, k, reported=True, mixture=True),
            StateEntry("adam_m", Scope.SAMPLE, k, reported=True),
            StateEntry("adam_v", Scope.SAMPLE, k, reported=True),
            StateEntry("adam_steps", Scope.CLIENT, reported=True),
        )

    def clusters_to_remove(self, state: ClientState | ClientStoreView, sizes: Tensor) -> Tensor | None:
        if self.config.removal_threshold is None:
            return None
        return clusters_to_remove(state.omega, sizes, state.seen, state.active, self.config.removal_threshold)

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """Concept grouping when it is due; a merge of near-identical clusters; adaptive K (App.
        F): remove the clusters whose share of γ fell below the threshold; or, with
        ``reseed_threshold``, re-seed a dead cluster from the largest one."""
        state, outcome = server.client_state, server.outcome
        if self.grouping is not None:
            grouped = self.grouping.actions(state, outcome.round_index)
            if grouped:
                return grouped
        if self.merging is not None:
            merged = self.merging.actions(state, outcome.train_sizes, outcome.round_index)
            if merged:
                return merged
        if self.config.reseed_threshold is not None:
            return self._reseed(state, outcome)
        remove = self.clusters_to_remove(state, outcome.train_sizes)
        if remove is None or not bool(remove.any()):
            return []
        kept = int((state.active & ~remove).sum())
        return [
            RemoveClusters(remove),  # the store renormalises the declared mixtures (γ) with ω
            Note(
                f"round {outcome.round_index}: removed cluster(s) {remove.nonzero().flatten().tolist()} "
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
            f"round {outcome.round_index}: re-seeded cluster {split.target} (share of γ below "
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
        if self.merging is not None:
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
        if self.merging is not None:
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
        if grouping is not None and grouping.hold and grouping.holds(context.round_index, context.extra):
            report = held_report(context.omega.to(report.gamma), context.active, labels, context.num_classes)
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


def check_options(
    use_label_stats: bool,
    label_noise_std: float | Sequence[float],
    removal_threshold: float | None,
    reseed_threshold: float | None,
    adam_gamma: bool,
) -> None:
    """ValueError, naming the option, for FedRC options out of range or in conflict."""
    stds = [label_noise_std] if isinstance(label_noise_std, (int, float)) else list(label_noise_std)
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) or not s >= 0 for s in stds):
        raise ValueError(
            f"label_noise_std must be >= 0 (one value or one per client), got {label_noise_std!r}"
        )
    if not use_label_stats and label_noise_std != 0.0:
        raise ValueError("label_noise_std applies to FedRC's label statistics; FedEM has none")
    if removal_threshold is not None and not 0 < removal_threshold < 1:
        raise ValueError(
            f"removal_threshold must be in (0, 1) (the paper uses 0.05), got {removal_threshold!r}"
        )
    if reseed_threshold is None:
        return
    threshold = reseed_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(f"reseed_threshold must be in (0, 1) (e.g. 0.05), got {threshold!r}")
    conflicts = {
        "removal_threshold": removal_threshold is not None,  # one removes the clusters the other revives
        "adam_gamma": adam_gamma,  # per-sample γ would have to be split too
    }
    named = [name for name, on in conflicts.items() if on]
    if named:
        raise ValueError(f"reseed_threshold cannot be combined with {', '.join(named)}: use one or the other")
