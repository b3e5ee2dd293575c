"""algorithms/rule_config.py: a rule takes its options as keywords or as a ready Config, never
both; an unknown option or a Config of another rule is refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_fedcluster.algorithms import CFL, IFCA, DFedEM, FedProx, FedRC, FedSoft, FeSEM
from lightning_fedcluster.algorithms.rule_config import NoOptions, build_config


@pytest.mark.parametrize("rule", [CFL, DFedEM, FedRC, FedSoft, FeSEM])
def test_keywords_and_a_config_build_the_same_frozen_options(rule):
    field = dataclasses.fields(rule.Config)[0]
    value = {bool: True, float: 0.5, int: 3}.get(type(field.default), field.default)
    by_keyword = rule(2, **{field.name: value})
    by_config = rule(2, config=rule.Config(**{field.name: value}))
    assert by_keyword.config == by_config.config and getattr(by_config.config, field.name) == value
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(by_config.config, field.name, field.default)


def test_a_rule_without_options_has_an_empty_config_and_fedprox_takes_mu_first():
    assert IFCA(3).config == NoOptions()
    assert FedProx(0.5).config == FedProx.Config(mu=0.5) and FedProx().config.mu == 0.01
    assert FedProx(config=FedProx.Config(mu=0.0)).config.mu == 0.0


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: FedRC(3, config=FedRC.Config(), adam_gamma=True),
            TypeError,
            r"FedRC got config= and the options \['adam_gamma'\]",
        ),
        (
            lambda: FedRC(3, config=CFL.Config()),
            TypeError,
            "FedRC's config must be a FedRC.Config, got CFLConfig",
        ),
        (
            lambda: CFL(3, eps3=1.0),
            TypeError,
            r"CFL got unknown option\(s\) \['eps3'\]; its options \(CFL.Config\) are: eps1, eps2",
        ),
        (lambda: IFCA(3, mu=0.1), TypeError, r"its options \(IFCA.Config\) are: none"),
        (lambda: FedProx(-1.0), ValueError, "mu must be a number >= 0, got -1.0"),
        (lambda: DFedEM(3, edge_probability=1.5), ValueError, r"edge_probability must be in \[0, 1\]"),
        (lambda: FeSEM(3, representation_layers="fc"), ValueError, "list of parameter-name prefixes"),
        (lambda: FedSoft(3, selection_size=0), ValueError, "selection_size"),
        (
            lambda: FedRC.Config(group_share=0.5),
            ValueError,
            "group_share=0.5 has no effect without group_round",
        ),
        (lambda: FedRC.Config(group_round=0), ValueError, "group_round must be a positive integer"),
    ],
)
def test_bad_options_are_refused_naming_the_option(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_build_config_returns_the_given_config_itself():
    config = CFL.Config(eps1=0.2)
    assert build_config("CFL", CFL.Config, config, {}) is config
