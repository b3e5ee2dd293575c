"""FedRCStrategy and FedEMStrategy: the soft EM mixture, with and without label statistics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.mixture import LABEL_STATS_FLOOR
from lightning_fedcluster.strategies.federated import FederatedStrategy


class FedRCStrategy(FederatedStrategy):
    """FedRC (Guo, Tang, Lin, ICML 2024): robust clustering that separates concepts, not label or
    feature styles. ``num_clusters=1`` is FedAvg.

    Args:
        hard_prediction: predict with the argmax-ω model only (TeHC) instead of the ω-mixture.
        hard_training: train only the argmax-ω model (TrHC; it hurts, paper Table 15: ablations only).
        adam_gamma: FedRC-Adam (App. H.3): Adam steps on γ, kept per sample between rounds.
        label_noise_std: σ of the Gaussian noise clients add to their label sums (App. E); one value,
            or one per client.
        removal_threshold: δ of adaptive K (App. F, e.g. 0.05): start with a generous
            ``num_clusters`` and remove clusters whose share of γ falls below δ.
        reseed_threshold: a remedy for dead clusters, off by default and in the paper presets
            (e.g. 0.05): after a round, the emptiest cluster whose share of γ is below it restarts
            as a copy of the largest cluster, which hands it a seeded random half of its clients
            (``lightning_fedcluster.algorithms.reseed``); a server optimizer restarts its state
            for the re-seeded cluster. Not with ``removal_threshold`` or ``adam_gamma``.
        group_round: concept grouping, a take-off mechanism (off by default and in the paper
            presets): in the rounds before it, clients compute a label-conditioned prediction
            signature in their E-step; after round ``group_round`` the server groups them by
            k-medoids and gives each group's clients ω ``group_share`` on one cluster
            (``lightning_fedcluster.algorithms.grouping``, docs: "How clusters form").
        group_share: the grouped clients' ω on their group's cluster.
        group_assign: "medoid" (k-medoids' groups, the default) or "mean": each client then moves
            to the group whose members are closest on average, weighted by the labels the two
            share, which keeps clients with noisy signatures (corrupted images, few shared
            labels) from dragging a group.
        group_margin: e.g. 0.7: group only the clients whose best group score is below this
            times the second best; the others get uniform ω and FedRC's E-step places them
            (None: group every client).
        group_hold: e.g. 5: for this many rounds after the grouping, a grouped client gives
            every sample γ = its ω, so that each concept's cluster learns all of the concept's
            labels before FedRC's E-step may move samples again (0: never).
        merge_threshold: from round ``merge_after`` on, retire one of the two clusters whose
            members' mean log-likelihood per sample differs least between them, when that gap is
            below this (nats; ``lightning_fedcluster.algorithms.merging``); None: never. With
            grouping, ``num_clusters`` is then an upper bound on K.
        label_stats_floor: the smallest C_{y,k} the E-step divides by (the authors' 1e-8). A cluster
            that holds almost no rows of label y otherwise pulls every label-y sample of every
            client towards itself by up to 1/floor, which breaks up concept clusters whose
            clients lack some labels (strong label skew, few clients per cluster); e.g. 0.01
            caps the pull at 100x.
        other arguments: see :class:`FederatedStrategy` (e.g. ``finetune_epochs=1`` is FedRC-FT,
            ``shared_layers=("features",)`` a shared feature extractor with clustered heads).
    """

    strategy_name = "fedrc"
    fixed_arguments = ("algorithm",)
    use_label_stats = True

    def __init__(
        self,
        num_clusters: int = 3,
        *,
        hard_prediction: bool = False,
        hard_training: bool = False,
        adam_gamma: bool = False,
        label_noise_std: float | Sequence[float] = 0.0,
        removal_threshold: float | None = None,
        reseed_threshold: float | None = None,
        group_round: int | None = None,
        group_share: float = 0.9,
        group_assign: str = "medoid",
        group_margin: float | None = None,
        group_hold: int = 0,
        merge_threshold: float | None = None,
        merge_after: int = 0,
        label_stats_floor: float = LABEL_STATS_FLOOR,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_clusters, **kwargs)
        # The options live in the rule alone (``strategy.algorithm.adam_gamma`` etc.).
        self._rule = FedRC(
            num_clusters,
            use_label_stats=self.use_label_stats,
            hard_prediction=hard_prediction,
            hard_training=hard_training,
            adam_gamma=adam_gamma,
            label_noise_std=label_noise_std,
            removal_threshold=removal_threshold,
            reseed_threshold=reseed_threshold,
            reseed_seed=self.seed,
            group_round=group_round,
            group_share=group_share,
            group_assign=group_assign,
            group_margin=group_margin,
            group_hold=group_hold,
            merge_threshold=merge_threshold,
            merge_after=merge_after,
            label_stats_floor=label_stats_floor,
        )

    @property
    def algorithm(self) -> FedRC:
        return self._rule


class FedEMStrategy(FedRCStrategy):
    """FedEM (Marfoq et al., NeurIPS 2021): the EM mixture without label statistics (C ≡ 1).
    Accepts FedRC's options except ``label_noise_std``. Works for regression tasks."""

    strategy_name = "fedem"
    use_label_stats = False
