"""The docs' "Adding an algorithm" example (docs/how-to/new-algorithm.md) runs as written: the
one-file rule with its own server action trains on both executors, and its named spelling
registers the same rule (Flower's grid: tests/flower/test_new_algorithm.py); the discovery
component of "A new discovery mechanism" runs in FedRC on both executors."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from lightning_fedcluster import FederatedStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "new-algorithm.md"


def _example() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    namespace: dict = {}
    for code in blocks:  # in order: the rule, then its registered name
        exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own example
    return namespace


def _datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=6, concepts=1, seed=0)


def _strategy(example: dict, executor: str) -> FederatedStrategy:
    return FederatedStrategy(algorithm=example["PrunedIFCA"](4), local_steps=2, executor=executor)


def _fit(strategy, rounds: int = 3):
    trainer = make_trainer(strategy, max_epochs=rounds)
    trainer.fit(MLPClassifier(), datamodule=_datamodule())
    return trainer


def test_the_one_file_algorithm_trains_and_its_own_action_runs_on_both_executors():
    example = _example()
    assert example["strategy"].algorithm.num_clusters == 4
    loop, vectorized = (_fit(_strategy(example, e)) for e in ("loop", "vectorized"))
    state = loop.lightning_module.client_state
    # Six clients of one concept cannot fill four clusters: the rule dropped the empty ones.
    assert int(state.active.sum()) < 4
    assert torch.all(state.omega[:, ~state.active] == 0)
    for a, b in zip(
        loop.lightning_module.state_dict().values(),
        vectorized.lightning_module.state_dict().values(),
        strict=True,
    ):  # the executors agree up to float32 summation order
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert torch.equal(state.active, vectorized.lightning_module.client_state.active)
    metrics = loop.test(loop.lightning_module, datamodule=_datamodule(), verbose=False)[0]
    assert metrics["test/local_acc"] > 0.3


def test_the_registered_name_builds_the_same_rule():
    example = _example()
    named = example["PrunedIFCAStrategy"](local_steps=2, executor="loop")
    assert type(named.algorithm).__name__ == "PrunedIFCA" and named.num_clusters == 4
    plain = _fit(_strategy(example, "loop")).lightning_module
    registered = _fit(named).lightning_module
    for a, b in zip(plain.state_dict().values(), registered.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def _merging(example: dict, executor: str, epsilon: float = 10.0, **options) -> FederatedStrategy:
    """The page's merge rule; ε = 10 merges a pair every round (independently initialised models
    are about √2 apart, relatively), so a 3-round run goes from 4 clusters to 1."""
    rule = example["MergingFedRC"](4, epsilon=epsilon, **options)
    return FederatedStrategy(algorithm=rule, local_steps=2, executor=executor)


def test_the_one_file_merge_rule_merges_alike_on_both_executors():
    example = _example()
    loop, vectorized = (_fit(_merging(example, e)) for e in ("loop", "vectorized"))
    assert vectorized.lightning_module.executor == "vectorized"
    state, other = loop.lightning_module.client_state, vectorized.lightning_module.client_state
    assert state.active.tolist() == other.active.tolist() and int(state.active.sum()) == 1
    assert torch.all(state.omega[:, ~state.active] == 0) and torch.all(
        state.label_sums[..., ~state.active] == 0
    )
    torch.testing.assert_close(state.omega.sum(1), torch.ones(6, dtype=torch.float64))  # mass moved, not lost
    torch.testing.assert_close(state.omega, other.omega, rtol=1e-5, atol=1e-6)
    for a, b in zip(
        loop.lightning_module.state_dict().values(),
        vectorized.lightning_module.state_dict().values(),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_registered_merge_rule_keeps_distinct_clusters():
    """At the page's ε = 0.05 the independently initialised clusters never merge."""
    named = _example()["MergingFedRCStrategy"](4, local_steps=2, executor="loop")
    assert type(named.algorithm).__name__ == "MergingFedRC" and named.algorithm.epsilon == 0.05
    assert _fit(named, rounds=2).lightning_module.client_state.active.tolist() == [True] * 4


def test_the_discovery_component_runs_in_fedrc_alike_on_both_executors():
    from lightning_fedcluster.algorithms import FedRC

    example = _example()
    assert example["settled"].algorithm.components == (example["SettledTraining"](2),)

    def fit(executor: str, components: tuple) -> object:
        torch.manual_seed(0)
        rule = FedRC(3, components=components)
        return _fit(FederatedStrategy(algorithm=rule, local_steps=2, executor=executor)).lightning_module

    component = (example["SettledTraining"](2),)
    loop, vectorized = fit("loop", component), fit("vectorized", component)
    streaks = loop.client_state.extra["settled_for"]
    assert float(streaks.max()) >= 2  # some client settled and trained one copy
    assert torch.equal(streaks, vectorized.client_state.extra["settled_for"])
    assert torch.equal(loop.client_state.extra["settled_on"], vectorized.client_state.extra["settled_on"])
    for a, b in zip(loop.state_dict().values(), vectorized.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    plain = fit("loop", ())
    pairs = zip(loop.state_dict().values(), plain.state_dict().values(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)  # a settled client trained one copy only
