"""The take-off grid's job list names only configurations it defines, each job once, and the
30-round hold that How clusters form recommends is the block it recommended before (hold 10, K events
from round 30) with ``group_hold=30`` and every K event from round 50, nothing else changed; the
release (``+release``) adds ``group_release`` to it and nothing else; the ω weighting's ramps
(``+omegaw15r10``/``r30``) are ``+omegaw15`` with ``omega_weighting_ramp``, and its half strength
(``+omegaw15s50``) with ``omega_weighting_strength=0.5``; the clipped weighting (``+omegaw15c5``) is
``+omegaw15`` with the strategy's ``gradient_clip_val=5``."""

from __future__ import annotations

import subprocess
import sys

from tests.docs.markdown_blocks import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from takeoff_configs import CONFIGS, K_EVENT_ROUNDS, job_list  # noqa: E402

HOLD30 = "robust10+merge+removal+floor10+ramp4+gretire10+hold30"
HOLD10 = "robust10+merge+removal+floor10+ramp4+events30+gretire10"


def test_every_job_names_a_defined_configuration_once():
    jobs = job_list([0, 1])
    assert {job.config for job in jobs} <= set(CONFIGS)
    assert len({job.name for job in jobs}) == len(jobs)


def test_every_configuration_has_jobs_in_the_grid():
    assert {job.config for job in job_list([0])} == set(CONFIGS)


def test_the_grid_lists_its_jobs_from_the_configurations_module(tmp_path):
    command = [sys.executable, "benchmarks/takeoff_grid.py", "run", "--data-root", str(tmp_path)]
    command += ["--out", str(tmp_path / "jobs.jsonl"), "--list", "--seeds", "0", "--only", f"{HOLD30}-k6/a1/"]
    listed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"{HOLD30}-k6/a1/s0" in listed
    assert f"{HOLD30}-k6/a10/s0" not in listed


def test_the_30_round_hold_is_the_10_round_block_held_longer():
    kind, k_start, held = CONFIGS[f"{HOLD30}-k6"]
    _, _, hold10 = CONFIGS[f"{HOLD10}-k6"]
    assert (kind, k_start) == ("fedrc", 6)
    assert CONFIGS[HOLD30] == ("fedrc", 3, held)
    changed = {key for key in held.keys() | hold10.keys() if held.get(key) != hold10.get(key)}
    assert changed == {"group_hold", *K_EVENT_ROUNDS}
    assert held["group_hold"] == 30 and hold10["group_hold"] == 10
    assert all(held[key] == 50 for key in K_EVENT_ROUNDS)


def test_the_release_is_the_30_round_hold_with_a_release_and_nothing_else():
    _, k_start, released = CONFIGS[f"{HOLD30}+release-k6"]
    _, _, held = CONFIGS[f"{HOLD30}-k6"]
    assert k_start == 6
    assert released == {**held, "group_release": 0.25, "group_release_rounds": 5}


def test_the_omega_weighting_ramps_are_the_weighting_from_round_15_with_a_ramp():
    _, _, released = CONFIGS[f"{HOLD30}+release-k6"]
    assert CONFIGS[f"{HOLD30}+release+omegaw15-k6"] == ("fedrc", 6, {**released, "omega_weighting_from": 15})
    for ramp in (10, 30):
        kind, k_start, options = CONFIGS[f"{HOLD30}+release+omegaw15r{ramp}-k6"]
        assert (kind, k_start) == ("fedrc", 6)
        assert options == {**released, "omega_weighting_from": 15, "omega_weighting_ramp": ramp}


def test_the_half_strength_weighting_is_the_weighting_from_round_15_ending_at_one_half():
    _, _, weighted = CONFIGS[f"{HOLD30}+release+omegaw15-k6"]
    kind, k_start, options = CONFIGS[f"{HOLD30}+release+omegaw15s50-k6"]
    assert (kind, k_start) == ("fedrc", 6)
    assert options == {**weighted, "omega_weighting_strength": 0.5}


def test_the_clipped_weighting_is_the_weighting_from_round_15_with_local_gradients_clipped_to_5():
    _, _, weighted = CONFIGS[f"{HOLD30}+release+omegaw15-k6"]
    kind, k_start, options = CONFIGS[f"{HOLD30}+release+omegaw15c5-k6"]
    assert (kind, k_start) == ("fedrc", 6)
    assert options == {**weighted, "gradient_clip_val": 5.0}
