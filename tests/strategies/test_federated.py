"""strategies/federated.py: ``FederatedStrategy(algorithm=...)`` runs any rule and equals the named
strategy that builds the same rule; K is set once; bad combinations are refused by name."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import IFCA, FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def _fit(strategy) -> lf.ClusteredModule:
    trainer = make_trainer(strategy, max_epochs=3)
    trainer.fit(MLPClassifier(lr=0.05), datamodule=DigitsFederated(num_clients=6, concepts=2, seed=0))
    return trainer.lightning_module


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_an_algorithm_object_trains_exactly_as_its_named_strategy(executor):
    options = dict(local_steps=2, clients_per_round=4, executor=executor)
    named = _fit(lf.FedRCStrategy(2, config=FedRC.Config(adam_gamma=True), **options))
    generic = _fit(lf.FederatedStrategy(algorithm=FedRC(2, adam_gamma=True), **options))
    for a, b in zip(named.state_dict().values(), generic.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(named.client_state.omega, generic.client_state.omega)
    assert named.plan.name == generic.plan.name == "FedRC"  # checkpoints of either resume the other


def test_k_comes_from_the_algorithm():
    strategy = lf.FederatedStrategy(algorithm=IFCA(4), local_steps=1)
    assert strategy.num_clusters == 4 and strategy.plan.num_clusters == 4 and strategy.plan.name == "IFCA"


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: lf.FederatedStrategy(), TypeError, r"FederatedStrategy\(algorithm=FedRC\(3\)"),
        (lambda: lf.FederatedStrategy(2, algorithm=FedRC(3)), ValueError, "set K once"),
        (lambda: lf.FederatedStrategy(algorithm="fedrc"), TypeError, "an Algorithm"),
        (lambda: lf.FedRCStrategy(algorithm=FedRC(3)), TypeError, "builds its own algorithm"),
        (lambda: FedRC(3, removal_threshold=2.0), ValueError, "removal_threshold must be in"),
    ],
)
def test_bad_algorithm_arguments_are_refused_by_name(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_an_option_that_does_not_fit_the_clients_is_refused_before_training():
    strategy = lf.FederatedStrategy(algorithm=FedRC(2, label_noise_std=[0.1, 0.2]), local_steps=1)
    with pytest.raises(ValueError, match="label_noise_std has 2 values but the datamodule has 6 clients"):
        _fit(strategy)
