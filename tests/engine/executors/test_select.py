"""engine/executors/select.py: the rule that chooses between the loop and the vectorised executor,
and the requests it refuses before training."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.executors import select
from lightning_fedcluster.models import FashionCNN, MLPClassifier
from tests.conftest import make_trainer


class ConvDigits(MLPClassifier):
    """A small convolutional network on the 8×8 digit images."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10)
        )


class AdamMLP(MLPClassifier):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class DropoutMLP(MLPClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


@pytest.mark.parametrize(
    ("strategy", "model", "expected"),
    [
        (lambda: lf.FedRCStrategy(3), lambda: MLPClassifier(hidden=(16,)), "vectorized"),
        (lambda: lf.FedRCStrategy(3), ConvDigits, "loop"),
        (lambda: lf.FedRCStrategy(3), lambda: AdamMLP(hidden=(16,)), "loop"),
        (lambda: lf.FedRCStrategy(3), DropoutMLP, "loop"),
        (lambda: lf.FedRCStrategy(3, shared_layers=("net.0",)), lambda: MLPClassifier(hidden=(16,)), "loop"),
        (lambda: lf.FedSoftStrategy(3, selection_size=2), lambda: MLPClassifier(hidden=(16,)), "loop"),
        (lambda: lf.DFedEMStrategy(3), lambda: MLPClassifier(hidden=(16,)), "loop"),
        (lambda: lf.FeSEMStrategy(3), lambda: MLPClassifier(hidden=(16,)), "loop"),
        (lambda: lf.CFLStrategy(3), lambda: MLPClassifier(hidden=(16,)), "loop"),
        (lambda: lf.FedProxStrategy(mu=0.1), lambda: MLPClassifier(hidden=(16,)), "vectorized"),
    ],
)
def test_auto_picks_the_vectorized_executor_only_where_it_runs_and_pays(strategy, model, expected):
    dm = DigitsFederated(num_clients=6, seed=0)
    trainer = make_trainer(strategy(), max_epochs=1, limit_val_batches=0)
    trainer.fit(model(), datamodule=dm)
    assert trainer.lightning_module.executor == expected
    chunked = trainer.lightning_module.chunk_size is not None
    assert chunked == (expected == "vectorized")


@pytest.mark.parametrize(
    ("model", "strategy", "reason"),
    [
        (lambda: AdamMLP(hidden=(16,)), lambda: lf.FedRCStrategy(3, executor="vectorized"), "SGD"),
        (DropoutMLP, lambda: lf.FedRCStrategy(3, executor="vectorized"), "random layers"),
        (
            lambda: MLPClassifier(hidden=(16,)),
            lambda: lf.FedSoftStrategy(3, selection_size=2, executor="vectorized"),
            "personal models",
        ),
    ],
)
def test_an_impossible_vectorized_request_fails_before_training(model, strategy, reason):
    trainer = make_trainer(strategy(), max_epochs=1, limit_val_batches=0)
    with pytest.raises(ValueError, match=reason) as error:
        trainer.fit(model(), datamodule=DigitsFederated(num_clients=6, seed=0))
    assert "executor='loop'" in str(error.value)
    assert trainer.global_step == 0


def test_bad_executor_arguments_name_the_fix():
    with pytest.raises(ValueError, match="executor must be one of"):
        lf.FedRCStrategy(3, executor="gpu")
    with pytest.raises(ValueError, match="clients_per_chunk must be an integer >= 1"):
        lf.FedRCStrategy(3, clients_per_chunk=0)


@pytest.mark.parametrize(
    ("device", "model", "expected"),
    [
        ("cuda", FashionCNN, "vectorized"),  # one NVIDIA H100 GPU: 0.204 s against 0.516 s a round
        ("cpu", FashionCNN, "loop"),  # 2 CPU cores: the vectorised executor is 2x slower
        ("cuda", lambda: MLPClassifier(hidden=(16,)), "vectorized"),
        ("cpu", lambda: MLPClassifier(hidden=(16,)), "vectorized"),
        ("mps", FashionCNN, "loop"),  # no measurement on this device type: the CPU's row
        ("cuda", lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "loop"),  # never measured
    ],
)
def test_auto_prefers_the_executor_recorded_faster_on_the_device(device, model, expected):
    executor, why = select.auto_preference(device, model())
    assert executor == expected
    assert device in why


def test_auto_on_cuda_takes_the_vectorized_executor_for_a_cnn_and_says_why(monkeypatch, caplog):
    """The trainer's device type decides: on CUDA a convolutional model trains vectorised
    (checked on CPU by reporting the trainer's device as CUDA), with one INFO line saying why."""
    monkeypatch.setattr(select, "device_type_of", lambda module: "cuda")
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(logger, "propagate", True)
    trainer = make_trainer(lf.FedRCStrategy(3), max_epochs=1, limit_val_batches=0)
    with caplog.at_level(logging.INFO, logger=logger.name):
        trainer.fit(ConvDigits(), datamodule=DigitsFederated(num_clients=6, seed=0))
    assert trainer.lightning_module.executor == "vectorized"
    lines = [r.getMessage() for r in caplog.records if "executor='auto'" in r.getMessage()]
    assert lines == [
        "executor='auto' chose the vectorized executor: convolutional model on cuda: "
        + select.AUTO_RULE[("cuda", "convolutional")][1]
    ]


def test_auto_says_when_the_vectorized_executor_cannot_run(caplog):
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    trainer = make_trainer(lf.FedRCStrategy(3), max_epochs=1, limit_val_batches=0)
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, logger=logger.name):
        patch.setattr(logger, "propagate", True)
        trainer.fit(DropoutMLP(), datamodule=DigitsFederated(num_clients=6, seed=0))
    assert trainer.lightning_module.executor == "loop"
    lines = [r.getMessage() for r in caplog.records if "executor='auto'" in r.getMessage()]
    assert len(lines) == 1 and "cannot run here: random layers" in lines[0]
