"""The user's LR schedulers step once per round: the lr used in round t is the schedule's value
at t on both executors, in Lightning's list and dict forms, and after resuming from a checkpoint;
ReduceLROnPlateau follows the round's training loss; meaningless settings fail before training."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.executors import loop as loop_executor
from lightning_fedcluster.engine.executors import vectorized as vectorized_executor
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

LR, ROUNDS = 0.2, 4


class ListScheduled(MLPClassifier):
    """``[optimizer], [scheduler]``: the lr halves every round."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 0.5**t)]


class DictScheduled(MLPClassifier):
    """The dict form, with a schedule that reads the trainer (cosine over max_epochs rounds)."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cosine, "interval": "epoch"}}


class Plateau(MLPClassifier):
    """ReduceLROnPlateau on the round's training loss, in "max" mode so that it reduces often."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": plateau, "monitor": "train/loss"}


def schedule(model_type: type, t: int) -> float:
    if model_type is ListScheduled:
        return LR * 0.5**t
    return LR * (1 + math.cos(math.pi * t / ROUNDS)) / 2  # CosineAnnealingLR, eta_min = 0


def only(values: set[float]) -> float:
    (value,) = values  # one lr for the whole round
    return value


class RoundLoss(pl.Callback):
    """The round's training loss, per round."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.losses.append(pl_module.round_metrics["train/loss"])


@pytest.fixture(scope="module")
def dm() -> DigitsFederated:
    return DigitsFederated(num_clients=6, concepts=2, seed=0)


def _strategy(executor: str) -> lf.FedRCStrategy:
    return lf.FedRCStrategy(2, local_steps=2, clients_per_round=4, executor=executor)


def _fit(model, dm, executor: str, rounds: int = ROUNDS, **options) -> pl.Trainer:
    trainer = make_trainer(_strategy(executor), max_epochs=rounds, limit_val_batches=0, **options)
    trainer.fit(model, datamodule=dm)
    assert trainer.lightning_module.executor == executor
    return trainer


@pytest.fixture
def used_lrs(monkeypatch) -> dict[str, dict[int, set[float]]]:
    """The lr every local step actually runs with, per executor and round: the loop executor's
    optimizer steps and the vectorised executor's local SGD."""
    used: dict[str, dict[int, set[float]]] = {"loop": {}, "vectorized": {}}
    current = {"round": -1}
    local_sgd, turn_step = vectorized_executor.local_sgd, loop_executor.turn_step

    def local_sgd_spy(template, params, buffers, batches, config, **kwargs):
        used["vectorized"].setdefault(current["round"], set()).add(config.lr)
        return local_sgd(template, params, buffers, batches, config, **kwargs)

    def turn_step_spy(setup, solver, *args, **kwargs):
        used["loop"].setdefault(current["round"], set()).add(solver.optimizer.param_groups[0]["lr"])
        return turn_step(setup, solver, *args, **kwargs)

    for executor in (loop_executor.LoopExecutor, vectorized_executor.VectorizedExecutor):

        def train_spy(self, round_state, train=executor.train):
            current["round"] = round_state.round_index
            return train(self, round_state)

        monkeypatch.setattr(executor, "train", train_spy)
    monkeypatch.setattr(vectorized_executor, "local_sgd", local_sgd_spy)
    monkeypatch.setattr(loop_executor, "turn_step", turn_step_spy)
    return used


@pytest.mark.parametrize("model_type", [ListScheduled, DictScheduled])
def test_the_lr_of_round_t_is_the_schedule_at_t_on_both_executors(dm, model_type, used_lrs):
    loop = _fit(model_type(lr=LR), dm, "loop")
    vectorized = _fit(model_type(lr=LR), dm, "vectorized")
    expected = [schedule(model_type, t) for t in range(ROUNDS)]
    assert sorted(used_lrs["loop"]) == sorted(used_lrs["vectorized"]) == list(range(ROUNDS))
    for t in range(ROUNDS):
        assert only(used_lrs["loop"][t]) == pytest.approx(expected[t], rel=1e-6), t
        assert only(used_lrs["vectorized"][t]) == pytest.approx(expected[t], rel=1e-6), t
    for a, b in zip(
        loop.lightning_module.parameters(), vectorized.lightning_module.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    constant = _fit(MLPClassifier(lr=LR), dm, "loop")
    pairs = zip(loop.lightning_module.parameters(), constant.lightning_module.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)
    (config,) = loop.lr_scheduler_configs  # handed to Lightning, which checkpoints it
    assert config.scheduler.last_epoch == ROUNDS


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_resume_continues_the_schedule_bit_identically(dm, executor, tmp_path):
    straight = _fit(ListScheduled(lr=LR), dm, executor)
    _fit(ListScheduled(lr=LR), dm, executor, rounds=2, enable_checkpointing=True,
         callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)])  # fmt: skip
    resumed = make_trainer(_strategy(executor), max_epochs=ROUNDS, limit_val_batches=0)
    resumed.fit(ListScheduled(lr=LR), datamodule=dm, ckpt_path=str(tmp_path / "last.ckpt"))
    for name, value in straight.lightning_module.state_dict().items():
        assert torch.equal(value, resumed.lightning_module.state_dict()[name]), name
    one, two = straight.lr_scheduler_configs[0].scheduler, resumed.lr_scheduler_configs[0].scheduler
    assert one.state_dict() == two.state_dict() and one.last_epoch == ROUNDS
    assert resumed.optimizers[0].param_groups[0]["lr"] == LR * 0.5**ROUNDS


def test_reduce_on_plateau_steps_each_round_with_the_round_training_loss(dm, used_lrs):
    used = RoundLoss()
    _fit(Plateau(lr=LR), dm, "loop", callbacks=[used])
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(reference, mode="max", factor=0.5, patience=0)
    expected = []
    for loss in used.losses:
        expected.append(reference.param_groups[0]["lr"])
        plateau.step(loss)
    assert len(used.losses) == ROUNDS
    assert [only(used_lrs["loop"][t]) for t in range(ROUNDS)] == pytest.approx(expected)
    assert len(set(expected)) > 1  # it did reduce


class StepInterval(MLPClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class PlateauWithout(MLPClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)]


class PlateauOnValidation(MLPClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val/local_acc"}}


@pytest.mark.parametrize(
    ("model_type", "message"),
    [
        (StepInterval, "interval='step'.*once per round.*'interval': 'epoch'"),
        (PlateauWithout, "ReduceLROnPlateau without a monitor.*'monitor': 'train/loss'"),
        (
            PlateauOnValidation,
            r"monitors 'val/local_acc'.*before its validation.*\['train/loss', 'train/acc'\]",
        ),
    ],
)
def test_schedules_without_meaning_per_round_fail_before_training(dm, model_type, message):
    trainer = make_trainer(_strategy("loop"), max_epochs=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(model_type(), datamodule=dm)
    assert trainer.global_step == 0
