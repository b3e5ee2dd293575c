"""FedRCStrategy and FedEMStrategy: the soft EM mixture, with and without label statistics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fedcluster.algorithms.fedrc import FedRC
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
        other arguments: see :class:`FederatedStrategy` (e.g. ``finetune_epochs=1`` is FedRC-FT,
            ``shared_layers=("features",)`` a shared feature extractor with clustered heads).
    """

    strategy_name = "fedrc"
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
        **kwargs: Any,
    ) -> None:
        super().__init__(num_clusters, **kwargs)
        stds = [label_noise_std] if isinstance(label_noise_std, (int, float)) else list(label_noise_std)
        if any(isinstance(s, bool) or not isinstance(s, (int, float)) or not s >= 0 for s in stds):
            raise ValueError(
                f"label_noise_std must be >= 0 (one value or one per client), got {label_noise_std!r}"
            )
        if removal_threshold is not None and not 0 < removal_threshold < 1:
            raise ValueError(
                f"removal_threshold must be in (0, 1) (the paper uses 0.05), got {removal_threshold!r}"
            )
        check_reseed(reseed_threshold, removal_threshold, adam_gamma)
        if not self.use_label_stats and (label_noise_std != 0.0):
            raise ValueError("label_noise_std applies to FedRC's label statistics; FedEM has none")
        self.hard_prediction = hard_prediction
        self.hard_training = hard_training
        self.adam_gamma = adam_gamma
        self.label_noise_std = label_noise_std
        self.removal_threshold = removal_threshold
        self.reseed_threshold = reseed_threshold
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
        )

    @property
    def algorithm(self) -> FedRC:
        return self._rule

    def check_datamodule(self, datamodule: Any) -> None:
        std = self.label_noise_std
        if not isinstance(std, (int, float)) and len(std) != datamodule.num_clients:
            raise ValueError(
                f"label_noise_std has {len(std)} values but the datamodule has {datamodule.num_clients} "
                "clients: give one σ per client, or a single σ for all"
            )


def check_reseed(threshold: float | None, removal: float | None, adam_gamma: bool) -> None:
    """ValueError unless ``reseed_threshold`` is None, or in (0, 1) and without a conflicting option."""
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(f"reseed_threshold must be in (0, 1) (e.g. 0.05), got {threshold!r}")
    conflicts = {
        "removal_threshold": removal is not None,  # one removes the clusters the other revives
        "adam_gamma": adam_gamma,  # per-sample γ would have to be split too
    }
    named = [name for name, on in conflicts.items() if on]
    if named:
        raise ValueError(f"reseed_threshold cannot be combined with {', '.join(named)}: use one or the other")


class FedEMStrategy(FedRCStrategy):
    """FedEM (Marfoq et al., NeurIPS 2021): the EM mixture without label statistics (C ≡ 1).
    Accepts FedRC's options except ``label_noise_std``. Works for regression tasks."""

    strategy_name = "fedem"
    use_label_stats = False
