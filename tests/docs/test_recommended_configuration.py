"""The two recommended FedRC configurations of the how-to "Finding the concepts" are the ones
measured: the K-unknown block names the same options with the same values as the runs recorded in
``benchmarks/records/takeoff_clip_cells_cpu_2026-11-29.jsonl`` (each run's ``options``), and the
K-known block is ``fedcluster fit``'s strategy. Neither block can drift from what was measured,
and ``FedRCStrategy`` takes both as given."""

from __future__ import annotations

import ast
import json

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.cli import MAIN_JOB_DEFAULTS
from tests.docs.markdown_blocks import DOCS, ROOT, blocks

PAGE = DOCS / "how-to" / "finding-the-concepts.md"
RECORD = ROOT / "benchmarks" / "records" / "takeoff_clip_cells_cpu_2026-11-29.jsonl"
# Keywords of the training recipe, not of concept discovery: the main job's, given in its block.
RECIPE = {"clients_per_round", "local_steps"}


def _strategy_block(name: str) -> tuple[int, dict]:
    """``name = lf.FedRCStrategy(K, ..., config=FedRC.Config(...))``: the page's one runnable block
    assigning ``name``, its strategy keywords and its Config's options as one flat dict."""
    calls = []
    for block in blocks(PAGE):
        if not block.runs:
            continue
        for statement in ast.parse(block.code).body:
            if isinstance(statement, ast.Assign) and [t.id for t in statement.targets] == [name]:
                calls.append(statement.value)
    assert len(calls) == 1, f"{PAGE.name} should assign {name} once, in a runnable block"
    (call,) = calls
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "lf.FedRCStrategy"
    options = {}
    for kw in call.keywords:
        if kw.arg == "config":
            assert isinstance(kw.value, ast.Call) and ast.unparse(kw.value.func) == "FedRC.Config"
            options |= {option.arg: ast.literal_eval(option.value) for option in kw.value.keywords}
        else:
            options[kw.arg] = ast.literal_eval(kw.value)
    return ast.literal_eval(call.args[0]), options


def _measured_options() -> tuple[int, dict]:
    runs = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    assert len(runs) >= 10
    starts = {run["k_start"] for run in runs}
    options = {json.dumps(run["options"], sort_keys=True) for run in runs}
    assert len(starts) == len(options) == 1, "the record's runs share one configuration"
    return starts.pop(), json.loads(options.pop())


def test_the_k_unknown_block_is_the_measured_configuration():
    num_clusters, options = _strategy_block("k_unknown")
    k_start, measured = _measured_options()
    assert num_clusters == k_start == 6
    assert options == measured
    # The relations the page tells users to keep when they scale the rounds.
    events = options["group_round"] + options["group_hold"] + 5
    assert options["merge_after"] == options["retire_after"] == options["removal_after"] == events
    assert options["omega_weighting_from"] == options["group_round"]
    assert options["group_late_round"] == options["group_round"] + 5


def test_the_k_known_block_is_what_fedcluster_fit_runs():
    num_clusters, options = _strategy_block("k_known")
    fit = dict(MAIN_JOB_DEFAULTS["trainer.strategy"]["init_args"])
    fit.pop("seed")
    fit |= fit.pop("config")
    assert num_clusters == fit.pop("num_clusters") == 3
    assert options == fit


def test_the_strategy_takes_both_blocks_as_given():
    for name in ("k_known", "k_unknown"):
        num_clusters, options = _strategy_block(name)
        strategy_only = RECIPE | {"gradient_clip_val"}
        fedrc = {key: value for key, value in options.items() if key not in strategy_only}
        given = {key: value for key, value in options.items() if key in strategy_only}
        strategy = lf.FedRCStrategy(num_clusters, config=FedRC.Config(**fedrc), **given)
        config = strategy.algorithm.config
        assert {key: getattr(config, key) for key in fedrc} == fedrc, name
        assert strategy.local_training.gradient_clip_val == options["gradient_clip_val"] == 5.0, name
