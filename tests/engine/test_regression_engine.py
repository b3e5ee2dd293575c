"""Regression losses through every algorithm that supports them (all but FedRC, whose label
statistics need classes), on the FedSoft synthetic task."""

from __future__ import annotations

import math

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import FedSoftSynthetic
from lightning_fedcluster.models import LinearRegressor
from tests.conftest import make_trainer

STRATEGIES = {
    "fedem": lambda: lf.FedEMStrategy(2, clients_per_round=6, local_steps=4),
    "dfedem": lambda: lf.DFedEMStrategy(2, local_steps=4),
    "ifca": lambda: lf.IFCAStrategy(2, clients_per_round=6, local_steps=4),
    "fesem": lambda: lf.FeSEMStrategy(2, clients_per_round=6, local_steps=4),
    "wecfl": lambda: lf.WeCFLStrategy(2, clients_per_round=6, local_steps=4),
    "fedsoft": lambda: lf.FedSoftStrategy(2, selection_size=3, local_steps=4),
    "cfl": lambda: lf.CFLStrategy(2, local_steps=4),
    "fedavg": lambda: lf.FedAvgStrategy(clients_per_round=6, local_steps=4),
    "fedprox": lambda: lf.FedProxStrategy(mu=0.1, clients_per_round=6, local_steps=4),
}


@pytest.fixture(scope="module")
def synthetic():
    return FedSoftSynthetic(
        num_clients=10, pattern="10:90", min_samples=40, max_samples=60, global_test_size=200, seed=0
    )


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_regression_trains_and_reports_mse(synthetic, name):
    model = LinearRegressor(10, 1, bias=False, optimizer="adam", lr=0.05)
    trainer = make_trainer(STRATEGIES[name](), max_epochs=4, limit_val_batches=0)
    trainer.fit(model, datamodule=synthetic)
    module = trainer.lightning_module
    assert module.task == "regression"
    results = trainer.test(module, datamodule=synthetic, verbose=False)[0]
    assert set(results) >= {"test/local_mse", "test/global_mse", "test/concept_ari"}
    assert "test/local_acc" not in results
    # The models learned something: better than predicting 0 (the targets' second moment) on the
    # rows the unseen clients are scored on.
    y = synthetic.evaluation_split("test", "global_score")[1].double()
    assert results["test/global_mse"] < float(y.square().mean()), results
    assert math.isfinite(module.round_metrics["train/mse"])


def test_regression_default_loss_is_the_per_sample_squared_error(synthetic):
    module = lf.ClusteredModule(LinearRegressor(10, 1, bias=False), 2, seed=0)
    module.task = "regression"
    x, y = synthetic.train_split(0)
    expected = (module.models[1](x).squeeze(1) - y).square()
    torch.testing.assert_close(module.per_sample_loss(1, x, y), expected)


def test_fedrc_refuses_regression_with_a_clear_message(synthetic):
    trainer = make_trainer(lf.FedRCStrategy(2), max_epochs=1)
    with pytest.raises(ValueError, match="use FedEMStrategy"):
        trainer.fit(LinearRegressor(10, 1), datamodule=synthetic)
