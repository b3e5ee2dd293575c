"""Strategies reject keyword arguments they do not read (a typo must not train with the default),
naming the nearest valid one; Lightning's DDP process arguments still pass. A named strategy's
flat rule options go into the rule's frozen Config, whose defaults they cannot drift from."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import timedelta

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment

import lightning_fedcluster.strategies as strategies
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import init_parameters, rule_config

CLASSES = [getattr(strategies, name) for name in strategies.__all__]

# A typo of one argument that only this class has, and the name it should suggest.
OWN_TYPOS = {
    "CFLStrategy": ("eps_1", "eps1"),
    "DFedEMStrategy": ("edge_prob", "edge_probability"),
    "FedProxStrategy": ("mu_", "mu"),
    "FedRCStrategy": ("discovry", "discovery"),
    "FedEMStrategy": ("confg", "config"),
    "FedSoftStrategy": ("selection_sizes", "selection_size"),
    "FeSEMStrategy": ("representation_layer", "representation_layers"),
    "WeCFLStrategy": ("representation_layer", "representation_layers"),
}


def test_every_strategy_class_is_covered():
    assert len(CLASSES) == 11 and FederatedStrategy in CLASSES


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_typo_is_a_type_error_that_suggests_the_name_and_lists_the_valid_ones(cls):
    with pytest.raises(TypeError) as error:
        cls(num_cluster=5)
    message = str(error.value)
    assert cls.__name__ in message and "'num_cluster' (did you mean 'num_clusters'?)" in message
    assert "Valid arguments:" in message and "local_steps" in message and "start_method" in message
    for fixed in cls.fixed_arguments:  # arguments the class sets itself are not offered
        assert f" {fixed}," not in message.split("Valid arguments:")[1]
    if cls.__name__ in OWN_TYPOS:
        typo, meant = OWN_TYPOS[cls.__name__]
        with pytest.raises(TypeError, match=rf"'{typo}' \(did you mean '{meant}'\?\)"):
            cls(**{typo: 1})


def test_clients_per_round_typo_no_longer_trains_every_client():
    with pytest.raises(TypeError, match=r"'clients_per_rnd' \(did you mean 'clients_per_round'\?\)"):
        strategies.FedRCStrategy(num_clusters=3, clients_per_rnd=10)


def test_all_unknown_names_are_reported_at_once_and_ddp_wrapper_arguments_are_explained():
    with pytest.raises(TypeError) as error:
        strategies.IFCAStrategy(3, find_unused_parameters=True, zzz=1)
    message = str(error.value)
    assert "unexpected keyword arguments 'find_unused_parameters' (an argument of DDP's gradient" in message
    assert "'zzz'" in message


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_ddp_process_arguments_still_reach_lightning(cls):
    environment = LightningEnvironment()
    own = {"algorithm": FedRC(3)} if cls is FederatedStrategy else {}  # the plain one runs a given rule
    strategy = cls(
        **own,
        start_method="spawn",
        process_group_backend="gloo",
        timeout=timedelta(minutes=3),
        cluster_environment=environment,
    )
    assert strategy.process_group_backend == "gloo"
    assert strategy.cluster_environment is environment
    assert strategy._start_method == "spawn" and strategy._timeout == timedelta(minutes=3)


def test_valid_names_come_from_the_signatures_subclass_first():
    names = init_parameters(strategies.FedRCStrategy, FederatedStrategy)
    assert names[:3] == ["num_clusters", "discovery", "config"]
    assert "clients_per_round" in names and "timeout" in names and len(names) == len(set(names))


# The Config fields a strategy sets itself instead of taking them as keywords.
SET_BY_THE_STRATEGY = {"seed", "reseed_seed", "use_label_stats", "weighted"}
NAMED = [cls for cls in CLASSES if cls is not FederatedStrategy]


@pytest.mark.parametrize("cls", NAMED, ids=lambda c: c.__name__)
def test_each_strategys_rule_options_default_as_its_rules_config(cls):
    strategy = cls(local_steps=1)
    config = strategy.algorithm.config
    assert dataclasses.is_dataclass(config) and type(config) is type(strategy.algorithm).Config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.some_option = None  # frozen: no option changes after the rule is built
    parameters = {}
    for klass in reversed(cls.__mro__[: cls.__mro__.index(FederatedStrategy)]):
        parameters.update(inspect.signature(klass.__init__).parameters)
    fixed = set(cls.fixed_arguments) | SET_BY_THE_STRATEGY
    if "config" in parameters:  # the Config itself is the keyword (FedRC, FedEM): the paper's by default
        assert parameters["config"].default is None
        assert config == dataclasses.replace(type(config)(), **{n: getattr(config, n) for n in fixed & set(
            f.name for f in dataclasses.fields(config))})
        return
    for field in dataclasses.fields(config):
        if field.name in fixed:
            continue
        assert field.name in parameters, f"{cls.__name__} does not take {type(config).__name__}.{field.name}"
        assert parameters[field.name].default == field.default, (cls.__name__, field.name)
        assert getattr(config, field.name) == field.default, (cls.__name__, field.name)
    options = {name for name in parameters if name not in ("self", "num_clusters", "kwargs")}
    assert options <= {field.name for field in dataclasses.fields(config)}, "an option outside the Config"


def test_the_strategy_forwards_its_options_into_the_frozen_config_and_checks_them_once():
    strategy = strategies.FedRCStrategy(
        3, config=FedRC.Config(adam_gamma=True, label_noise_std=[0.1, 0.2]), seed=7,
    )
    assert strategy.algorithm.config == FedRC.Config(
        adam_gamma=True, label_noise_std=(0.1, 0.2), reseed_seed=7
    )
    assert strategies.FedEMStrategy(2).algorithm.config.use_label_stats is False
    assert not hasattr(strategies.CFLStrategy(eps1=0.3), "eps1")  # one home: the rule's config
    assert strategies.CFLStrategy(eps1=0.3).algorithm.config.eps1 == 0.3
    with pytest.raises(ValueError, match=r"eps2 must be a number > 0, got -1"):
        strategies.CFLStrategy(eps2=-1)
    with pytest.raises(ValueError, match=r"smoother \(σ\) must be in \(0, 1\), got 1.5"):
        strategies.FedSoftStrategy(smoother=1.5)


def test_rule_config_picks_the_configs_fields_and_the_strategys_own_values():
    config = rule_config(FedRC.Config, {"adam_gamma": True, "seed": 3, "self": object()}, reseed_seed=3)
    assert config == FedRC.Config(adam_gamma=True, reseed_seed=3)


@pytest.mark.parametrize("cls", NAMED, ids=lambda c: c.__name__)
def test_the_cli_help_documents_each_rule_option_from_its_config(cls):
    import docstring_parser

    documented = {}
    for klass in reversed(cls.__mro__):
        if klass.__doc__ and klass.__module__.startswith("lightning_fedcluster"):
            documented |= {p.arg_name: p.description for p in docstring_parser.parse(klass.__doc__).params}
    config = type(cls(local_steps=1).algorithm).Config
    config_docs = {p.arg_name: p.description for p in docstring_parser.parse(config.__doc__).params}
    own = set(inspect.signature(cls.__init__).parameters) - {"self", "num_clusters", "kwargs"}
    for name in own - set(cls.fixed_arguments):
        if name in config_docs:
            assert documented.get(name) == config_docs[name], (
                f"{cls.__name__}.{name} is not documented from {config}"
            )
        else:  # the strategy's own (FedRC's discovery and config): documented on the strategy
            assert documented.get(name), f"{cls.__name__}.{name} is not documented"


# The keywords FedRCStrategy took before its options moved into config=FedRC.Config(...).
FORMER_KEYWORDS = (
    "hard_prediction", "hard_training", "adam_gamma", "label_noise_std", "removal_threshold",
    "removal_after", "reseed_threshold", "group_round", "group_share", "group_assign", "group_margin",
    "group_hold", "group_late_round", "group_ramp", "group_retire", "group_release",
    "group_release_rounds", "merge_threshold", "merge_after", "retire_after", "omega_weighting_from",
    "omega_weighting_ramp", "omega_weighting_strength", "label_stats_floor",
)  # fmt: skip


@pytest.mark.parametrize("cls", [strategies.FedRCStrategy, strategies.FedEMStrategy], ids=["fedrc", "fedem"])
def test_fedrcs_own_keywords_are_at_most_six_beyond_federated_strategys(cls):
    own = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "kwargs")]
    base = set(inspect.signature(FederatedStrategy.__init__).parameters)
    beyond = [name for name in own if name not in base]
    assert beyond == ["discovery", "config"] and len(beyond) <= 6
    assert len(FORMER_KEYWORDS) == 24
    assert not set(FORMER_KEYWORDS) & set(init_parameters(cls, FederatedStrategy))


def test_fedrcs_former_keywords_are_a_type_error_naming_each_and_the_config_that_takes_them():
    given = {"group_round": 15, "merge_threshold": 0.5, "adam_gamma": False, "local_steps": 2}
    with pytest.raises(TypeError) as error:
        strategies.FedRCStrategy(3, **given)
    message = str(error.value)
    assert message.startswith(
        "FedRCStrategy takes FedRC's options in config=, not as keywords: group_round, merge_threshold, "
        "adam_gamma. Pass config=FedRC.Config(group_round=15, merge_threshold=0.5, adam_gamma=False)"
    )
    assert "--trainer.strategy.config.group_round" in message
    for name in FORMER_KEYWORDS:  # every one of them, for FedEM too
        with pytest.raises(TypeError, match=rf"FedEMStrategy takes FedRC's options in config=.*: {name}\."):
            strategies.FedEMStrategy(2, **{name: None})


def test_the_config_fields_the_strategy_sets_are_its_own_and_a_contradiction_is_refused():
    config = FedRC.Config(adam_gamma=True)
    rule = strategies.FedEMStrategy(2, seed=5, config=config).algorithm
    assert rule.config == dataclasses.replace(config, use_label_stats=False, reseed_seed=5)
    assert config.use_label_stats is True and config.reseed_seed == 0  # the given Config is not changed
    contradiction = (
        r"FedRCStrategy sets config.use_label_stats from the strategy's class \(True\), "
        r"got config.use_label_stats=False: .* use FedEMStrategy"
    )
    with pytest.raises(ValueError, match=contradiction):
        strategies.FedRCStrategy(2, config=FedRC.Config(use_label_stats=False))
    with pytest.raises(ValueError, match=r"config.reseed_seed=4: .* pass seed=4 to the strategy"):
        strategies.FedRCStrategy(2, seed=1, config=FedRC.Config(reseed_seed=4))
    same = strategies.FedRCStrategy(2, seed=4, config=FedRC.Config(reseed_seed=4))
    assert same.algorithm.config.reseed_seed == 4
    with pytest.raises(TypeError, match=r"config must be a FedRC.Config \(FedRCConfig\), got dict"):
        strategies.FedRCStrategy(2, config={"adam_gamma": True})
    with pytest.raises(ValueError, match="label_noise_std applies to FedRC's label statistics; FedEM has"):
        strategies.FedEMStrategy(2, config=FedRC.Config(label_noise_std=0.1))
