"""engine/executors/vectorized.py: the vectorised executor against the loop executor through the
public API (classification, regression, local epochs)."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.algorithms.discovery.grouping import HELD, RELEASED
from lightning_fedcluster.datamodules import DigitsFederated, FedSoftSynthetic
from lightning_fedcluster.models import LinearRegressor, MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.mechanisms import EVERY_MECHANISM


class MomentumMLP(MLPClassifier):
    """An MLP whose solver uses every SGD option the vectorised executor reproduces."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)


STRATEGIES = {
    "fedrc": lambda executor: lf.FedRCStrategy(
        3, clients_per_round=9, local_epochs=1, executor=executor, clients_per_chunk=4
    ),
    "fedrc_adam_noise_removal": lambda executor: lf.FedRCStrategy(
        4,
        clients_per_round=9,
        local_steps=3,
        config=FedRC.Config(adam_gamma=True, label_noise_std=0.1, removal_threshold=0.2),
        executor=executor,
        clients_per_chunk=4,
    ),
    "fedrc_grouping": lambda executor: lf.FedRCStrategy(
        4,
        clients_per_round=9,
        local_steps=2,
        config=EVERY_MECHANISM,
        gradient_clip_val=0.5,
        executor=executor,
        clients_per_chunk=4,
    ),
    "fedrc_discovery": lambda executor: lf.FedRCStrategy(
        5,
        discovery=lf.ConceptDiscovery(),
        clients_per_round=9,
        local_steps=2,
        executor=executor,
        clients_per_chunk=4,
    ),
    "fedem": lambda executor: lf.FedEMStrategy(3, local_epochs=1, executor=executor),
    "ifca": lambda executor: lf.IFCAStrategy(3, local_epochs=1, executor=executor, clients_per_chunk=5),
    "fedavg": lambda executor: lf.FedAvgStrategy(clients_per_round=8, local_steps=4, executor=executor),
    "fedprox": lambda executor: lf.FedProxStrategy(mu=0.5, local_epochs=1, executor=executor),
}


def _fit(strategy, model, datamodule, rounds: int = 3):
    trainer = make_trainer(strategy, max_epochs=rounds, limit_val_batches=0)
    trainer.fit(model, datamodule=datamodule)
    metrics = trainer.test(trainer.lightning_module, datamodule=datamodule, verbose=False)[0]
    return trainer.lightning_module, metrics


def _assert_same_run(loop, vectorized) -> None:
    (loop_module, loop_metrics), (vec_module, vec_metrics) = loop, vectorized
    assert loop_module.executor == "loop" and vec_module.executor == "vectorized"
    loop_state, vec_state = loop_module.state_dict(), vec_module.state_dict()
    for name, tensor in loop_state.items():
        torch.testing.assert_close(vec_state[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(
        vec_module.client_state.omega, loop_module.client_state.omega, atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        vec_module.client_state.label_sums, loop_module.client_state.label_sums, atol=1e-4, rtol=1e-5
    )
    assert torch.equal(vec_module.client_state.active, loop_module.client_state.active)
    assert torch.equal(vec_module.client_state.seen, loop_module.client_state.seen)
    for name, value in loop_module.round_metrics.items():
        assert vec_module.round_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for name, value in loop_metrics.items():
        assert vec_metrics[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_vectorized_executor_equals_the_loop(name):
    """Same E-step, minibatches, SGD rule and aggregation: the same run up to float summation order."""
    dm = DigitsFederated(num_clients=12, seed=0)
    runs = [
        _fit(STRATEGIES[name](executor), MomentumMLP(hidden=(32,)), dm) for executor in ("loop", "vectorized")
    ]
    _assert_same_run(*runs)
    # The run trained: the weights moved away from the initial copies.
    initial = lf.ClusteredModule(MomentumMLP(hidden=(32,)), runs[0][0].num_clusters).state_dict()
    assert any(not torch.equal(initial[n], t) for n, t in runs[1][0].state_dict().items())
    if name == "fedrc_grouping":  # the grouping retired clusters (group_retire), then one merge
        assert int(runs[0][0].client_state.active.sum()) < 3
        assert bool((runs[0][0].client_state.extra[HELD] == RELEASED).any())  # and a release


def test_vectorized_executor_equals_the_loop_for_regression():
    dm = FedSoftSynthetic(num_clients=10, pattern="linear", min_samples=30, max_samples=70, seed=0)
    runs = [
        _fit(
            lf.FedEMStrategy(2, local_epochs=2, executor=executor),
            LinearRegressor(10, 1, optimizer="sgd", lr=0.01),
            dm,
        )
        for executor in ("loop", "vectorized")
    ]
    _assert_same_run(*runs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_loop_and_vectorised_executors_agree_with_local_epochs(drop_last):
    results = {}
    for executor in ("loop", "vectorized"):
        strategy = lf.FedRCStrategy(
            2, local_epochs=2, drop_last=drop_last, clients_per_round=4, executor=executor
        )
        dm = DigitsFederated(num_clients=6, concepts=2, batch_size=16, seed=0)
        trainer = make_trainer(strategy, max_epochs=2)
        trainer.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=dm)
        assert trainer.lightning_module.executor == executor
        steps = strategy.round_schedule(dm).steps_per_client
        per_pass = dm.train_sizes // 16 if drop_last else (dm.train_sizes + 15) // 16
        assert torch.equal(steps, 2 * per_pass)
        results[executor] = trainer.lightning_module.state_dict()
    for name, value in results["loop"].items():
        torch.testing.assert_close(results["vectorized"][name], value, rtol=1e-4, atol=1e-5)
