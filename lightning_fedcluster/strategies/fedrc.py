"""FedRCStrategy and FedEMStrategy: the soft EM mixture, with and without label statistics.

The rule's options live in ``FedRC.Config`` and reach the strategy as one ``config=``; the
concept-discovery policy (``discovery=``) supplies the mechanisms that find the concepts. The
strategy sets two of the Config's fields itself: ``use_label_stats`` (its class) and
``reseed_seed`` (its ``seed``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from lightning_fedcluster.algorithms.discovery.policy import ConceptDiscovery
from lightning_fedcluster.algorithms.discovery.protocol import Component
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.fedrc_config import FedRCConfig
from lightning_fedcluster.strategies.federated import FederatedStrategy

# The Config's fields that are the paper's rule itself, not a mechanism that builds components.
RULE_OPTIONS = frozenset(
    {"use_label_stats", "hard_prediction", "hard_training", "adam_gamma", "label_noise_std",
     "label_stats_floor", "reseed_seed"}
)
# The Config's fields the strategy sets itself: (field, what the strategy reads it from).
SET_BY_THE_STRATEGY = {"use_label_stats": "the strategy's class", "reseed_seed": "the strategy's seed"}


def config_options() -> list[str]:
    """The Config's options a user may set (every field but those the strategy sets), read from
    the fields so that they follow the Config."""
    return [field.name for field in fields(FedRCConfig) if field.name not in SET_BY_THE_STRATEGY]


def reject_config_keywords(strategy: str, given: Mapping[str, Any]) -> None:
    """A TypeError, before anything is built, for FedRC options given as strategy keywords: it
    names every one given and the ``config=`` that carries them, with the values given."""
    options = set(config_options())
    moved = [name for name in given if name in options]  # in the order given
    if not moved:
        return
    as_config = ", ".join(f"{name}={given[name]!r}" for name in moved)
    raise TypeError(
        f"{strategy} takes FedRC's options in config=, not as keywords: {', '.join(moved)}. "
        f"Pass config=FedRC.Config({as_config}) "
        "(from lightning_fedcluster.algorithms import FedRC; on the command line "
        f"--trainer.strategy.config.{moved[0]} VALUE)"
    )


class FedRCStrategy(FederatedStrategy):
    """FedRC (Guo, Tang, Lin, ICML 2024): robust clustering that separates concepts, not label or
    feature styles. ``num_clusters=1`` is FedAvg.

    ``FedRCStrategy(3)`` is the paper's rule. FedRC's options (FedRC-Adam, label noise, adaptive
    K, the take-off mechanisms, ...) are fields of ``FedRC.Config``
    ([`FedRCConfig`][lightning_fedcluster.algorithms.fedrc_config.FedRCConfig]), given as
    ``config=FedRC.Config(adam_gamma=True)``; the strategy sets the Config's ``use_label_stats``
    (FedRC: True, FedEM: False) and ``reseed_seed`` (its ``seed``). For the other keywords see
    [`FederatedStrategy`][lightning_fedcluster.strategies.FederatedStrategy] (e.g.
    ``finetune_epochs=1`` is FedRC-FT, ``shared_layers=("features",)`` a shared feature extractor
    with clustered heads).

    Args:
        num_clusters: K, the number of clusters (with ``discovery``, an upper bound on the number
            of concepts).
        discovery: the concept-discovery policy, e.g.
            [`ConceptDiscovery()`][lightning_fedcluster.algorithms.discovery.policy.ConceptDiscovery]:
            it places the clients on the concepts and keeps a model per concept found, from
            ``num_clusters`` as an upper bound. None (the default): the paper's FedRC exactly. Not
            with the config's mechanism options (grouping, merging, retirement, removal,
            re-seeding, the ω weighting): the policy replaces them.
        config: FedRC's options, a ``FedRC.Config`` (None: the paper's defaults); e.g.
            ``FedRC.Config(adam_gamma=True)``, on the command line
            ``--trainer.strategy.config.adam_gamma true``.
    """

    strategy_name = "fedrc"
    fixed_arguments = ("algorithm",)
    use_label_stats = True

    def __init__(
        self,
        num_clusters: int = 3,
        *,
        discovery: ConceptDiscovery | None = None,
        config: FedRCConfig | None = None,
        **kwargs: Any,
    ) -> None:
        reject_config_keywords(type(self).__name__, kwargs)
        super().__init__(num_clusters, **kwargs)
        config = self._own_config(config)
        self.discovery = discovery
        components = None if discovery is None else self._discovery_components(discovery, config)
        self._rule = FedRC(num_clusters, config, components=components)
        if discovery is not None:  # the checkpoint metadata records it: a resume that changes it is warned
            self._rule.discovery = repr(discovery)

    def _own_config(self, config: FedRCConfig | None) -> FedRCConfig:
        """``config`` with the fields the strategy sets itself; a value of one of those that is
        neither the Config's default nor the strategy's is refused, naming it."""
        if config is None:
            config = FedRCConfig()
        if not isinstance(config, FedRCConfig):
            raise TypeError(
                f"config must be a FedRC.Config (FedRCConfig), got {type(config).__name__}: "
                "e.g. config=FedRC.Config(adam_gamma=True)"
            )
        own = {"use_label_stats": self.use_label_stats, "reseed_seed": self.seed}
        defaults = FedRCConfig()
        for name, value in own.items():
            given = getattr(config, name)
            if given != value and given != getattr(defaults, name):
                fix = (
                    f"use {'FedRCStrategy' if given else 'FedEMStrategy'}"
                    if name == "use_label_stats"
                    else f"pass seed={given!r} to the strategy"
                )
                raise ValueError(
                    f"{type(self).__name__} sets config.{name} from {SET_BY_THE_STRATEGY[name]} "
                    f"({value!r}), got config.{name}={given!r}: leave it out of the config and {fix}"
                )
        return replace(config, **own)

    def _discovery_components(
        self, discovery: ConceptDiscovery, config: FedRCConfig
    ) -> tuple[Component, ...]:
        """The policy's components; a config whose mechanism options would build others is refused,
        naming the options (the policy holds every mechanism)."""
        if not callable(getattr(discovery, "components", None)):
            raise TypeError(
                f"discovery must be a concept-discovery policy such as ConceptDiscovery() (or None: "
                f"the paper's FedRC), got {type(discovery).__name__}"
            )
        if config.components():
            defaults = FedRCConfig()
            named = [
                field.name
                for field in fields(FedRCConfig)
                if field.name not in RULE_OPTIONS
                and getattr(config, field.name) != getattr(defaults, field.name)
            ]
            raise ValueError(
                f"discovery={type(discovery).__name__}(...) and the config's mechanism options "
                f"{', '.join(named)} were both given: the policy holds every mechanism; drop those "
                "options, or pass discovery=None to run them on the paper's FedRC"
            )
        return tuple(discovery.components())

    @property
    def algorithm(self) -> FedRC:
        return self._rule


class FedEMStrategy(FedRCStrategy):
    """FedEM (Marfoq et al., NeurIPS 2021): the EM mixture without label statistics (C ≡ 1).
    Takes FedRCStrategy's ``discovery`` and ``config`` (every ``FedRC.Config`` option except
    ``label_noise_std``; the strategy sets ``use_label_stats=False``). Works for regression tasks.

    Args:
        num_clusters: K, the number of mixture components (with ``discovery``, an upper bound).
        discovery: the concept-discovery policy, e.g. ``ConceptDiscovery()``; None (the default):
            FedEM exactly.
        config: the rule's options, a ``FedRC.Config`` (None: the defaults).
    """

    strategy_name = "fedem"
    use_label_stats = False
