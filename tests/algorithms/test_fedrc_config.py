"""algorithms/fedrc_config.py: FedRC's options, each refused by name when out of range, in
conflict or without the option it needs; the grouping and merging objects built from them."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.fedrc_config import FedRCConfig, check_options
from lightning_fedcluster.algorithms.mixture import LABEL_STATS_FLOOR


def test_defaults_are_the_papers_and_every_mechanism_is_off():
    config = FedRCConfig()
    assert FedRC.Config is FedRCConfig
    assert config.use_label_stats and not config.adam_gamma and config.label_noise_std == 0.0
    assert config.label_stats_floor == LABEL_STATS_FLOOR == 1e-8
    assert config.grouping is None and config.merging is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.group_round = 3  # type: ignore[misc]


def test_per_client_noise_becomes_a_tuple_and_the_mechanisms_are_built():
    config = FedRCConfig(
        label_noise_std=[0.1, 0.2], group_round=4, group_margin=0.7, group_hold=2, merge_threshold=0.5
    )
    assert config.label_noise_std == (0.1, 0.2)
    grouping, merging = config.grouping, config.merging
    assert (grouping.group_round, grouping.share, grouping.margin, grouping.hold) == (4, 0.9, 0.7, 2)
    assert (merging.threshold, merging.after) == (0.5, 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"label_noise_std": -0.1}, r"label_noise_std must be >= 0 \(one value or one per client\)"),
        ({"label_noise_std": [0.1, True]}, "label_noise_std must be >= 0"),
        ({"use_label_stats": False, "label_noise_std": 0.1}, "FedEM has none"),
        ({"removal_threshold": 1.0}, r"removal_threshold must be in \(0, 1\) \(the paper uses 0.05\)"),
        ({"reseed_threshold": 0.0}, r"reseed_threshold must be in \(0, 1\)"),
        (
            {"reseed_threshold": 0.05, "removal_threshold": 0.05, "adam_gamma": True},
            "reseed_threshold cannot be combined with removal_threshold, adam_gamma",
        ),
        ({"label_stats_floor": 0.0}, r"label_stats_floor must be in \(0, 1\) \(the authors' 1e-8\), got 0.0"),
        ({"label_stats_floor": True}, "label_stats_floor must be in"),
        ({"group_round": 3, "adam_gamma": True}, "group_round cannot be combined with adam_gamma"),
        ({"merge_threshold": 0.5, "adam_gamma": True}, "merge_threshold cannot be combined with adam_gamma"),
        ({"group_hold": 2}, "group_hold=2 has no effect without group_round: set group_round too"),
        ({"group_assign": "mean"}, "group_assign='mean' has no effect without group_round"),
        ({"merge_after": 5}, "merge_after=5 has no effect without merge_threshold"),
    ],
)
def test_bad_options_are_refused_naming_the_option_and_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        FedRCConfig(**options)


def test_check_options_accepts_the_papers_settings():
    check_options(True, 0.0, None, None, False)
    check_options(True, (0.0, 0.5), 0.05, None, True)  # App. F removal with FedRC-Adam
    check_options(False, 0.0, None, 0.05, False)  # FedEM with re-seeding


@pytest.mark.parametrize("value", [-1, True, 1.5, "3"])
def test_omega_weighting_from_must_be_a_round_index(value):
    with pytest.raises(ValueError, match="omega_weighting_from must be a number of rounds >= 0"):
        FedRC.Config(omega_weighting_from=value)


@pytest.mark.parametrize("value", [-1, True, 1.5, "3"])
def test_omega_weighting_ramp_must_be_a_count_of_rounds(value):
    with pytest.raises(ValueError, match="omega_weighting_ramp must be a number of rounds >= 0"):
        FedRC.Config(omega_weighting_from=5, omega_weighting_ramp=value)


def test_omega_weighting_ramp_without_the_weighting_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="omega_weighting_ramp=3 has no effect without omega_weighting_from"):
        FedRC.Config(omega_weighting_ramp=3)


@pytest.mark.parametrize("value", [0, -0.5, 1.5, True, "0.5", float("nan")])
def test_omega_weighting_strength_must_be_in_zero_to_one(value):
    with pytest.raises(ValueError, match=r"omega_weighting_strength must be a number in \(0, 1\]"):
        FedRC.Config(omega_weighting_from=5, omega_weighting_strength=value)


def test_omega_weighting_strength_without_the_weighting_is_refused_naming_the_fix():
    message = "omega_weighting_strength=0.5 has no effect without omega_weighting_from"
    with pytest.raises(ValueError, match=message):
        FedRC.Config(omega_weighting_strength=0.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group_hold": -1}, r"group_hold must be a non-negative integer \(rounds\), got -1"),
        ({"group_share": 1.5}, r"group_share must be in \(0, 1\], got 1.5"),
        ({"group_assign": "best"}, "group_assign must be one of"),
        ({"group_margin": 2.0}, r"group_margin must be in \(0, 1\)"),
        ({"group_ramp": -2}, "group_ramp must be a non-negative integer"),
        ({"group_retire": 1.0}, "group_retire must be a share of the rows"),
        ({"group_late_round": "5"}, "group_late_round must be an integer"),
        ({"group_release": -0.5}, "group_release must be >= 0"),
        ({"group_release_rounds": 0}, "group_release_rounds must be a positive integer"),
        ({"merge_after": -3}, "merge_after must be a number of rounds >= 0, got -3"),
        ({"removal_after": -1}, "removal_after must be a number of rounds >= 0, got -1"),
        ({"omega_weighting_ramp": -1}, "omega_weighting_ramp must be a number of rounds >= 0, got -1"),
        ({"omega_weighting_strength": 3.0}, r"omega_weighting_strength must be a number in \(0, 1\]"),
    ],
)
def test_an_invalid_value_is_named_before_the_option_it_needs(options, message):
    """FedRCStrategy(3, group_hold=-1) named the missing group_round, not the bad value."""
    with pytest.raises(ValueError, match=message):
        FedRCConfig(**options)
