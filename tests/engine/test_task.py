"""engine/task.py: the one place classification and regression differ (hand-computed values), and
regression trained through every strategy reports the MSE."""

from __future__ import annotations

import math

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.models import LinearRegressor
from tests.conftest import make_trainer


def test_a_task_equals_and_hashes_like_its_name():
    task = Task.of("regression")
    assert task is Task.REGRESSION and task == "regression" and {"regression": 1}[task] == 1
    assert f"{task}" == "regression" and str(Task.CLASSIFICATION) == "classification"
    with pytest.raises(
        ValueError, match=r"task must be one of \['classification', 'regression'\], got 'ranking'"
    ):
        Task.of("ranking")


def test_classification_scores_losses_and_metric_names():
    task = Task.CLASSIFICATION
    mixture = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]], dtype=torch.float64)
    y = torch.tensor([0, 0, 0])
    nll, correct = task.loss_and_score(mixture, y)
    assert float(correct) == 2.0
    assert float(nll) == pytest.approx(-(math.log(0.7) + math.log(0.2) + math.log(0.6)))
    raw = torch.tensor([[2.0, 0.0]])
    assert float(task.default_loss()(raw, torch.tensor([1]))) == pytest.approx(math.log(1 + math.e**2))
    torch.testing.assert_close(task.outputs(raw), torch.softmax(raw, 1))
    assert task.predict(mixture).tolist() == [0, 1, 0]
    assert task.round_metrics == ("train/loss", "train/acc") and task.label_classes(10) == 10


def test_regression_scores_are_squared_errors_averaged_over_outputs():
    task = Task.REGRESSION
    prediction = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    y = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    # per sample: (1 + 4) / 2 = 2.5 and (1 + 1) / 2 = 1
    assert float(task.score(prediction, y)) == pytest.approx(3.5)
    error, again = task.loss_and_score(prediction.double(), y)
    assert float(error) == float(again) == pytest.approx(3.5)
    assert task.default_loss()(prediction, y).tolist() == pytest.approx([2.5, 1.0])
    assert task.outputs(torch.ones(3, 2, 1)).shape == (3, 2) and task.predict(prediction) is prediction
    assert task.round_metrics == ("train/loss", "train/mse") and task.label_classes(10) == 0


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
