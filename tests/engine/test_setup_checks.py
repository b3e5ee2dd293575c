"""Warnings before and during training for what the engine accepts but the user likely did not
mean: more cluster models than clients, hooks of the user's module it never calls, and training
that stays at chance level (``engine.setup_checks``)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.setup_checks import CHANCE_ROUNDS, check_chance_level, input_shape_error
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


class LoggingMLP(MLPClassifier):
    """A user's module written for plain Lightning: its own steps and self.log calls."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("my_train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("my_val_acc", (self(x).argmax(1) == y).float().mean())


def _messages(record) -> list[str]:
    return [str(w.message) for w in record]


def test_more_cluster_models_than_clients_warns_before_training():
    dm = DigitsFederated(num_clients=5, seed=0)
    trainer = make_trainer(lf.FedRCStrategy(8, local_steps=1), max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"num_clusters=8 but the datamodule has only 5 clients.*<= 5"):
        trainer.fit(MLPClassifier(), datamodule=dm)


def test_the_users_own_steps_and_logs_are_named_as_not_called_with_what_is_used_instead():
    dm = DigitsFederated(num_clients=4, seed=0)
    trainer = make_trainer(lf.FedAvgStrategy(local_steps=1), max_epochs=1, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(LoggingMLP(), datamodule=dm)
    (message,) = [m for m in _messages(record) if "does not call" in m]
    assert message.startswith("LoggingMLP defines training_step, validation_step, which lightning-fedcluster")
    assert "self.log calls" in message
    assert "minimizes the cross-entropy of forward's logits" in message
    assert "val/local_acc" in message and "Callback" in message
    assert "my_train_loss" not in trainer.callback_metrics  # indeed never called


def test_the_librarys_own_models_and_a_plain_lightning_module_raise_no_such_warning():
    dm = DigitsFederated(num_clients=4, seed=0)
    trainer = make_trainer(lf.FedAvgStrategy(local_steps=1), max_epochs=1, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=dm)  # defines training_step for standalone use
    assert not [m for m in _messages(record) if "does not call" in m or "num_clusters=" in m]


def test_a_learning_rate_that_trains_to_chance_warns_once_naming_the_round():
    """lr=50 collapses the MLP to a constant prediction: the loss stays at log C (it never grows
    100x, so the divergence check alone was silent)."""
    strategy = lf.FedRCStrategy(3, clients_per_round=10, local_steps=5)
    trainer = make_trainer(strategy, max_epochs=6, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(lr=50.0), datamodule=DigitsFederated(seed=0))
    chance = [m for m in _messages(record) if "chance level" in m]
    assert len(chance) == 1, chance
    assert chance[0].startswith(f"round {CHANCE_ROUNDS + 1}: training is at chance level")
    assert "log 10" in chance[0] and "learning rate" in chance[0]


def test_the_quick_start_job_trains_without_the_chance_warning():
    """The main job's defaults (``fedcluster fit``): FedRC, K=3, 10 of 30 clients, 5 local steps,
    MLP lr 0.2. Its first rounds are slow (loss 2.28 after one round, log 10 = 2.30) but below
    chance from the first aggregation on."""
    strategy = lf.FedRCStrategy(3, clients_per_round=10, local_steps=5, seed=0)
    trainer = make_trainer(strategy, max_epochs=12, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=30, concepts=3, seed=0))
    assert not [m for m in _messages(record) if "chance level" in m or "diverging" in m]


def test_chance_counting_needs_consecutive_rounds_and_skips_regression_and_round_zero():
    at_chance = {"train/loss": math.log(10) + 0.01, "train/acc": 0.1}
    learning = {"train/loss": math.log(10) - 0.02, "train/acc": 0.1}
    assert check_chance_level(0, at_chance, 0, 10) == 0  # round 0: the untrained models
    assert check_chance_level(0, at_chance, 1, 10) == 1
    assert check_chance_level(1, learning, 2, 10) == 0  # below log C: reset
    assert check_chance_level(1, {"train/loss": 5.0, "train/mse": 1.0}, 2, 0) == 1  # regression
    with pytest.warns(UserWarning, match=r"round 4: training is at chance level for 3 rounds"):
        assert check_chance_level(CHANCE_ROUNDS - 1, at_chance, 3, 10) == -1
    assert check_chance_level(-1, at_chance, 4, 10) == -1  # once


def test_inputs_of_another_size_than_the_model_name_both_sizes_and_the_fix_before_training():
    """Flat 8-value rows into the 64-feature MLP: torch's "mat1 and mat2 shapes cannot be
    multiplied (8x8 and 64x128)" alone named neither the model nor what to change."""
    x, y = torch.rand(400, 8), torch.randint(0, 10, (400,))
    dm = lf.FederatedDataModule.from_tensors(x, y, num_clients=10, corrupt_fraction=0)
    with pytest.raises(
        ValueError,
        match=r"MLPClassifier.forward cannot take the datamodule's inputs .*"
        r"takes 64 features per sample but gets 8 .*Build the model for samples of shape \(8,\)",
    ):
        make_trainer(lf.FedRCStrategy(2), max_epochs=1).fit(MLPClassifier(), datamodule=dm)


def test_a_conv_net_given_flat_rows_gets_the_generic_shape_message_and_other_errors_pass_through():
    image = torch.rand(4, 1, 8, 8)
    conv = torch.nn.Conv2d(1, 2, 3)
    with pytest.raises(RuntimeError) as caught:
        conv(image.flatten(1))
    error = input_shape_error("MyCNN", image.flatten(1), caught.value, "the datamodule's")
    assert isinstance(error, ValueError) and "MyCNN was built for inputs of another shape than (64,)" in str(
        error
    )
    unrelated = RuntimeError("CUDA error: device-side assert triggered")
    assert input_shape_error("MyCNN", image, unrelated) is unrelated


def _getting_started_module() -> type:
    """The getting-started page's own ``MyClassifier``, as the page defines it."""
    from tests.docs.markdown_blocks import ROOT, blocks

    (code,) = [b.code for b in blocks(ROOT / "docs" / "getting-started.md") if "class MyClassifier" in b.code]
    namespace: dict = {"__name__": "getting_started"}
    exec(compile(code, "getting-started.md", "exec"), namespace)
    return namespace["MyClassifier"]


class NllStep(MLPClassifier):
    """A training_step whose loss is not the engine's (it minimizes cross-entropy of forward)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.nll_loss(self(x), y)


def _fit_messages(module, fits: int = 1) -> list[str]:
    dm = DigitsFederated(num_clients=4, seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(fits):
            trainer = make_trainer(lf.FedAvgStrategy(local_steps=1), max_epochs=1, limit_val_batches=0)
            trainer.fit(module, datamodule=dm)
    return [m for m in _messages(record) if "does not call" in m]


def test_the_getting_started_module_fits_without_the_not_called_warning():
    """Its training_step returns the cross-entropy of its forward and logs nothing: the engine's
    own loss, so nothing of it is lost."""
    assert _fit_messages(_getting_started_module()()) == []


def test_a_training_step_with_another_loss_still_warns_and_only_once_per_module_class():
    messages = _fit_messages(NllStep(), fits=2)
    assert len(messages) == 1, messages
    assert messages[0].startswith("NllStep defines training_step")


def test_round_options_past_the_runs_length_warn_before_training_naming_each():
    strategy = lf.FedRCStrategy(
        3, local_steps=1, config=FedRC.Config(group_round=500, merge_threshold=0.1, merge_after=50),
    )
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=4, seed=0))
    (message,) = [m for m in _messages(record) if "max_epochs=2" in m]
    assert "group_round=500" in message and "merge_after=50" in message
    assert "rounds 1-2" in message and "no round to train after them" in message


def test_round_options_within_the_run_give_no_such_warning():
    strategy = lf.FedRCStrategy(3, local_steps=1, config=FedRC.Config(group_round=1))
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=4, seed=0))
    assert not [m for m in _messages(record) if "max_epochs=" in m]


def test_clients_without_validation_or_test_rows_are_counted_before_training():
    dm = DigitsFederated(num_clients=30, seed=0, test_fraction=0.02)
    dm.setup("fit")
    no_val, no_test = int((dm.val_sizes == 0).sum()), int((dm.test_sizes == 0).sum())
    assert no_val > 0 and no_test > 0  # the case the warning is about
    trainer = make_trainer(lf.FedAvgStrategy(local_steps=1), max_epochs=1, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=dm)
    (message,) = [m for m in _messages(record) if "no validation rows" in m]
    assert message.startswith(f"{no_val} of 30 clients have no validation rows and {no_test} no test rows")
    assert "val/local_acc" in message and "test_fraction" in message
