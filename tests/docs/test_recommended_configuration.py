"""The K-from-the-data configuration that How clusters form recommends is the one the take-off grid
measured (``benchmarks/takeoff_configs.py``'s
``robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15c5-k6``): the page's block and the
grid's options name the same arguments with the same values, so neither can drift from the other,
and the strategy takes them as given."""

from __future__ import annotations

import ast
import sys

import lightning_fedcluster as lf
from tests.docs.markdown_blocks import DOCS, ROOT, blocks

sys.path.insert(0, str(ROOT / "benchmarks"))
import takeoff_configs  # noqa: E402

MEASURED = "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15c5-k6"


def _recommended_call() -> ast.Call:
    page = DOCS / "how-clusters-form.md"
    found = [b for b in blocks(page) if b.runs and "merge_after=50" in b.code]
    assert len(found) == 1, "How clusters form should hold one block with the recommended configuration"
    (statement,) = ast.parse(found[0].code).body
    assert isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)
    return statement.value


def test_the_recommended_configuration_is_the_measured_one():
    call = _recommended_call()
    num_clusters = ast.literal_eval(call.args[0])
    options = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    kind, k_start, measured = takeoff_configs.CONFIGS[MEASURED]
    assert (kind, num_clusters) == ("fedrc", k_start) == ("fedrc", 6)
    assert options == measured
    assert options["merge_after"] == options["retire_after"] == options["removal_after"] == 50
    assert options["group_round"] + options["group_hold"] == 45  # the K events: five rounds after the hold
    assert options["group_retire"] == options["removal_threshold"] == 0.1
    assert (options["group_release"], options["group_release_rounds"]) == (0.25, 5)
    assert options["omega_weighting_from"] == options["group_round"]  # the round after the grouping
    assert options["gradient_clip_val"] == 5.0
    strategy = lf.FedRCStrategy(num_clusters, **options)
    algorithm_options = {name: value for name, value in options.items() if name != "gradient_clip_val"}
    config = strategy.algorithm.config
    assert {name: getattr(config, name) for name in algorithm_options} == algorithm_options
    assert strategy.local_training.gradient_clip_val == 5.0  # a strategy argument, not FedRC's
