"""benchmarks/_common.py's grouping flags (``digits_concepts.py``, ``authors_comparison.py``): each
flag becomes FedRCStrategy's argument of the same name, defaults are left to the strategy, and a
ramp without a hold, or a grouping flag without ``--group-round``, is refused by the strategy,
naming the argument."""

from __future__ import annotations

import argparse

import pytest
from _common import add_grouping_arguments, fedrc_keywords, grouping_options

import lightning_fedcluster as lf


def _options(*flags: str) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group-round", type=int, default=None)
    add_grouping_arguments(parser)
    return grouping_options(parser.parse_args(list(flags)))


def test_the_flags_become_the_strategy_s_grouping_arguments():
    flags = ("--group-round", "20", "--group-assign", "mean", "--group-margin", "0.7", "--group-hold", "10",
             "--group-late-round", "25", "--group-ramp", "4", "--group-retire", "0.1", "--group-release",
             "0.25", "--group-release-rounds", "3")  # fmt: skip
    options = _options(*flags)
    assert options == {
        "group_round": 20, "group_share": 0.9, "group_assign": "mean", "group_margin": 0.7,
        "group_hold": 10, "group_late_round": 25, "group_ramp": 4, "group_retire": 0.1,
        "group_release": 0.25, "group_release_rounds": 3,
    }  # fmt: skip
    rule = lf.FedRCStrategy(3, **fedrc_keywords(options)).algorithm
    assert (rule.config.grouping.ramp, rule.config.grouping.retire) == (4, 0.1)
    assert (rule.config.release.margin, rule.config.release.rounds) == (0.25, 3)
    assert "group_ramp" not in _options("--group-round", "20", "--group-hold", "10")
    assert "group_retire" not in _options("--group-round", "20", "--group-margin", "0.7")
    zero = _options("--group-round", "20", "--group-margin", "0.7", "--group-retire", "0")
    assert zero["group_retire"] == 0.0  # 0 is a setting (retire the groupless clusters), not "off"


def test_a_ramp_without_a_hold_is_refused_by_the_strategy():
    with pytest.raises(ValueError, match="group_ramp has no effect without group_hold"):
        lf.FedRCStrategy(3, **fedrc_keywords(_options("--group-round", "20", "--group-ramp", "4")))


def test_a_retire_share_without_a_margin_is_refused_by_the_strategy():
    with pytest.raises(ValueError, match="group_retire"):
        lf.FedRCStrategy(3, **fedrc_keywords(_options("--group-round", "20", "--group-retire", "0.1")))


@pytest.mark.parametrize(
    "flag", [("--group-hold", "10"), ("--group-share", "0.8"), ("--group-release", "0.2")]
)
def test_a_grouping_flag_without_group_round_is_refused_not_dropped(flag):
    options = _options(*flag)
    assert options  # passed on to the strategy, which names what it lacks
    with pytest.raises(ValueError, match="has no effect without group_(round|hold)"):
        lf.FedRCStrategy(3, **fedrc_keywords(options))
    assert _options() == {}  # no flag: no grouping argument at all
