"""A rule that reads no per-sample losses (FedAvg, FedProx) gets no E-step pass: no no-grad
forward over the clients' training rows, the same weights, and training metrics from the local
steps (``engine/client.py``: ``needs_loss_pass``, ``step_metric_sums``)."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms.fedprox import FedProx
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.protocols import ClientOutputs
from lightning_fedcluster.engine.client import needs_loss_pass
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

SIZES = (9, 14, 5, 11)


def labels_of(x: torch.Tensor) -> torch.Tensor:
    """Labels that are a function of the inputs, so a forward's rows give their labels."""
    return (x[:, 0] * 3).long().clamp(0, 2)


def datamodule() -> lf.FederatedDataModule:
    generator = torch.Generator().manual_seed(0)
    splits = []
    for n in SIZES:
        x = torch.rand(n, 6, generator=generator)
        splits.append((x, labels_of(x)))
    return lf.FederatedDataModule(splits, [(x[:2], y[:2]) for x, y in splits], num_classes=3, batch_size=4)


class Recording(MLPClassifier):
    """Counts the rows each forward sees without gradients (E-step passes, evaluation) while
    ``recording``, and keeps the inputs and outputs of the forwards with gradients (local steps)."""

    recording = False
    no_grad_rows = 0
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if Recording.recording:
            if torch.is_grad_enabled():
                Recording.steps.append((x.detach().clone(), out.detach().clone()))
            else:
                Recording.no_grad_rows += x.shape[0]
        return out


class RecordLastRound(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        Recording.recording, Recording.no_grad_rows, Recording.steps = True, 0, []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        Recording.recording = False


def fit(strategy: lf.FederatedStrategy) -> lf.ClusteredModule:
    torch.manual_seed(0)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0, callbacks=[RecordLastRound()])
    trainer.fit(Recording(in_features=6, num_classes=3, hidden=(8,), lr=0.2), datamodule=datamodule())
    return trainer.lightning_module


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_fedavg_runs_no_forward_without_gradients_over_the_training_rows(executor):
    fit(lf.FedAvgStrategy(local_epochs=1, executor=executor, seed=0))
    assert Recording.no_grad_rows == 0
    fit(lf.FedProxStrategy(mu=0.1, local_epochs=1, executor=executor, seed=0))
    assert Recording.no_grad_rows == 0
    # A clustered rule needs the pass: every client's rows once per round, through each of the K = 2
    # models (the vectorised executor forwards them in one vmapped call).
    fit(lf.FedRCStrategy(2, local_epochs=1, executor=executor, seed=0))
    assert Recording.no_grad_rows == (2 if executor == "loop" else 1) * sum(SIZES)


def test_fedavgs_training_metrics_are_the_local_steps_mean_loss_and_accuracy():
    """The loop's round metrics are the mean cross-entropy and accuracy of every row of every
    local step, as the steps' own forwards saw them (dropout and all)."""
    module = fit(lf.FedAvgStrategy(local_epochs=2, executor="loop", seed=0))
    x = torch.cat([x for x, _ in Recording.steps])
    logits = torch.cat([out for _, out in Recording.steps])
    y = labels_of(x)
    assert x.shape[0] == 2 * sum(SIZES)  # two local epochs of every client's rows, nothing else
    loss = F.cross_entropy(logits.double(), y).item()
    accuracy = (logits.argmax(1) == y).double().mean().item()
    assert module.round_metrics["train/loss"] == pytest.approx(loss, rel=1e-6)
    assert module.round_metrics["train/acc"] == pytest.approx(accuracy, abs=1e-12)


@pytest.mark.parametrize("options", [{"local_epochs": 2}, {"local_steps": 3}])
def test_the_executors_agree_on_the_step_metrics(options):
    metrics = {}
    for executor in ("loop", "vectorized"):
        module = fit(lf.FedAvgStrategy(executor=executor, seed=0, **options))
        metrics[executor] = module.round_metrics
    for name in ("train/loss", "train/acc"):  # the weights agree to float32 rounding (test_vectorized.py)
        assert math.isfinite(metrics["loop"][name])
        assert metrics["vectorized"][name] == pytest.approx(metrics["loop"][name], rel=1e-6)


class FedProxReadingOutputs(FedProx, ClientOutputs):
    pass


class OwnLoss(MLPClassifier):
    def per_sample_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="none")


def test_only_a_one_model_assignment_that_reads_nothing_skips_the_pass():
    model = MLPClassifier(in_features=6, num_classes=3)
    assert not needs_loss_pass(FedProx(0.0), model)
    assert not needs_loss_pass(FedProx(0.1), model)
    assert needs_loss_pass(FedRC(1), model)  # a one-cluster mixture still reads its losses
    assert needs_loss_pass(FedProxReadingOutputs(0.0), model)
    assert needs_loss_pass(FedProx(0.0), OwnLoss(in_features=6, num_classes=3))  # its outputs unseen
