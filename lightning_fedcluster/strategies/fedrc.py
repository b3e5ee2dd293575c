"""FedRCStrategy and FedEMStrategy: the soft EM mixture, with and without label statistics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.mixture import LABEL_STATS_FLOOR
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import documents_rule_options, rule_config


@documents_rule_options(FedRC.Config)
class FedRCStrategy(FederatedStrategy):
    """FedRC (Guo, Tang, Lin, ICML 2024): robust clustering that separates concepts, not label or
    feature styles. ``num_clusters=1`` is FedAvg.

    The keywords beyond [`FederatedStrategy`][lightning_fedcluster.strategies.FederatedStrategy]'s
    (``hard_prediction``, ``hard_training``,
    ``adam_gamma``, ``label_noise_std``, ``removal_threshold``, ``removal_after``, ``reseed_threshold``,
    ``group_round``, ``group_share``, ``group_assign``, ``group_margin``, ``group_hold``,
    ``group_late_round``, ``group_ramp``, ``group_retire``, ``group_release``,
    ``group_release_rounds``, ``merge_threshold``, ``merge_after``,
    ``retire_after``, ``omega_weighting_from``, ``omega_weighting_ramp``, ``omega_weighting_strength``,
    ``label_stats_floor``)
    are FedRC's options, forwarded into ``FedRC.Config``
    ([`FedRCConfig`][lightning_fedcluster.algorithms.fedrc_config.FedRCConfig]), where their defaults, checks
    and docs live; the strategy's ``seed`` seeds re-seeding. For the others see
    [`FederatedStrategy`][lightning_fedcluster.strategies.FederatedStrategy] (e.g. ``finetune_epochs=1`` is
    FedRC-FT,
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
        removal_after: int = 0,
        reseed_threshold: float | None = None,
        group_round: int | None = None,
        group_share: float = 0.9,
        group_assign: str = "medoid",
        group_margin: float | None = None,
        group_hold: int = 0,
        group_late_round: int | None = None,
        group_ramp: int = 0,
        group_retire: float | None = None,
        group_release: float | None = None,
        group_release_rounds: int = 5,
        merge_threshold: float | None = None,
        merge_after: int = 0,
        retire_after: int | None = None,
        omega_weighting_from: int | None = None,
        omega_weighting_ramp: int = 0,
        omega_weighting_strength: float = 1.0,
        label_stats_floor: float = LABEL_STATS_FLOOR,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_clusters, **kwargs)
        config = rule_config(
            FedRC.Config, locals(), use_label_stats=self.use_label_stats, reseed_seed=self.seed
        )
        self._rule = FedRC(num_clusters, config)

    @property
    def algorithm(self) -> FedRC:
        return self._rule


class FedEMStrategy(FedRCStrategy):
    """FedEM (Marfoq et al., NeurIPS 2021): the EM mixture without label statistics (C ≡ 1).
    Accepts FedRC's options except ``label_noise_std``. Works for regression tasks."""

    strategy_name = "fedem"
    use_label_stats = False
