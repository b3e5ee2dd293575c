"""``benchmarks/takeoff_runs.py``, run as a user runs it: its job list (``run --list``) names only
configurations it defines (``configs``), each job once, and the 30-round hold that How clusters
form recommends is the block it recommended before (hold 10, K events from round 30) with
``group_hold=30`` and every K event from round 50, nothing else changed; the release
(``+release``) adds ``group_release`` to it and nothing else; the ω weighting's ramps
(``+omegaw15r10``/``r30``) are ``+omegaw15`` with ``omega_weighting_ramp``, and its half strength
(``+omegaw15s50``) with ``omega_weighting_strength=0.5``; the clipped weighting (``+omegaw15c5``) is
``+omegaw15`` with the strategy's ``gradient_clip_val=5``."""

from __future__ import annotations

import pytest

from tests.helpers.takeoff_runs import listed_jobs, takeoff_configs

K_EVENT_ROUNDS = ("merge_after", "retire_after", "removal_after")  # the round each K event starts from
HOLD30 = "robust10+merge+removal+floor10+ramp4+gretire10+hold30"
HOLD10 = "robust10+merge+removal+floor10+ramp4+events30+gretire10"


@pytest.fixture(scope="module")
def configs() -> dict[str, tuple[str, int, dict]]:
    return takeoff_configs()


def test_every_job_names_a_defined_configuration_once(configs, tmp_path):
    jobs = listed_jobs(tmp_path, "--seeds", "0", "1")
    assert {job.rsplit("/", 2)[0] for job in jobs} <= set(configs)
    assert len(set(jobs)) == len(jobs)


def test_every_configuration_has_jobs(configs, tmp_path):
    assert {job.rsplit("/", 2)[0] for job in listed_jobs(tmp_path, "--seeds", "0")} == set(configs)


def test_the_runs_list_their_jobs_from_the_configurations_module(tmp_path):
    listed = listed_jobs(tmp_path, "--seeds", "0", "--only", f"{HOLD30}-k6/a1/")
    assert f"{HOLD30}-k6/a1/s0" in listed
    assert f"{HOLD30}-k6/a10/s0" not in listed


def test_the_30_round_hold_is_the_10_round_block_held_longer(configs):
    kind, k_start, held = configs[f"{HOLD30}-k6"]
    _, _, hold10 = configs[f"{HOLD10}-k6"]
    assert (kind, k_start) == ("fedrc", 6)
    assert configs[HOLD30] == ("fedrc", 3, held)
    changed = {key for key in held.keys() | hold10.keys() if held.get(key) != hold10.get(key)}
    assert changed == {"group_hold", *K_EVENT_ROUNDS}
    assert held["group_hold"] == 30 and hold10["group_hold"] == 10
    assert all(held[key] == 50 for key in K_EVENT_ROUNDS)


def test_the_release_is_the_30_round_hold_with_a_release_and_nothing_else(configs):
    _, k_start, released = configs[f"{HOLD30}+release-k6"]
    _, _, held = configs[f"{HOLD30}-k6"]
    assert k_start == 6
    assert released == {**held, "group_release": 0.25, "group_release_rounds": 5}


def test_the_omega_weighting_ramps_are_the_weighting_from_round_15_with_a_ramp(configs):
    _, _, released = configs[f"{HOLD30}+release-k6"]
    assert configs[f"{HOLD30}+release+omegaw15-k6"] == ("fedrc", 6, {**released, "omega_weighting_from": 15})
    for ramp in (10, 30):
        kind, k_start, options = configs[f"{HOLD30}+release+omegaw15r{ramp}-k6"]
        assert (kind, k_start) == ("fedrc", 6)
        assert options == {**released, "omega_weighting_from": 15, "omega_weighting_ramp": ramp}


def test_the_half_strength_weighting_is_the_weighting_from_round_15_ending_at_one_half(configs):
    _, _, weighted = configs[f"{HOLD30}+release+omegaw15-k6"]
    kind, k_start, options = configs[f"{HOLD30}+release+omegaw15s50-k6"]
    assert (kind, k_start) == ("fedrc", 6)
    assert options == {**weighted, "omega_weighting_strength": 0.5}


def test_the_clipped_weighting_is_the_weighting_from_round_15_with_local_gradients_clipped_to_5(configs):
    _, _, weighted = configs[f"{HOLD30}+release+omegaw15-k6"]
    kind, k_start, options = configs[f"{HOLD30}+release+omegaw15c5-k6"]
    assert (kind, k_start) == ("fedrc", 6)
    assert options == {**weighted, "gradient_clip_val": 5.0}
