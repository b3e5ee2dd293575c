"""strategies/fedprox.py: FedProxStrategy and FedAvgStrategy train one model with the FedProx rule
(FedAvg: μ = 0), refuse a negative μ and say that a configuration's num_clusters is not used."""

from __future__ import annotations

import pytest

from lightning_fedcluster import FedAvgStrategy, FedProxStrategy
from lightning_fedcluster.algorithms import FedProx


def test_fedprox_trains_one_model_with_its_proximal_coefficient() -> None:
    strategy = FedProxStrategy(mu=0.3, local_steps=2)
    assert isinstance(strategy.algorithm, FedProx) and strategy.algorithm.config == FedProx.Config(mu=0.3)
    assert strategy.num_clusters == 1
    assert strategy.plan.name == "FedProx" and strategy.plan.rule is strategy.algorithm
    assert strategy.plan.local_steps == 2


def test_fedavg_is_fedprox_without_the_proximal_term() -> None:
    strategy = FedAvgStrategy(clients_per_round=4)
    assert strategy.strategy_name == "fedavg" and strategy.plan.name == "FedAvg"
    assert isinstance(strategy.algorithm, FedProx) and strategy.algorithm.config.mu == 0.0
    assert strategy.num_clusters == 1 and strategy.plan.clients_per_round == 4


@pytest.mark.parametrize("mu", [-0.1, float("nan")])
def test_a_negative_mu_is_refused(mu) -> None:
    with pytest.raises(ValueError, match="mu must be a number >= 0"):
        FedProxStrategy(mu=mu)


def test_a_configurations_num_clusters_is_said_to_be_unused() -> None:
    # A clustered configuration switched to FedAvg keeps its num_clusters: said, not an error.
    with pytest.warns(UserWarning, match="trains one model: num_clusters=3 from the configuration"):
        assert FedAvgStrategy(num_clusters=3).num_clusters == 1


def test_fedavg_refuses_a_mu_and_names_fedprox() -> None:
    with pytest.raises(TypeError, match=r"mu is fixed at 0.*got mu=0\.5.*FedProxStrategy\(mu=\.\.\.\)"):
        FedAvgStrategy(mu=0.5)
