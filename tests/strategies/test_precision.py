"""strategies/precision.py: with ``Trainer(precision="bf16-mixed")`` every forward the engine makes
runs under bfloat16 autocast (local steps, E-steps, the estimation pass at fit start, evaluation),
the logits come back as float32, and the result is the float32 run's up to bfloat16 rounding.
Precisions the engine does not train with are refused by name before training."""

from __future__ import annotations

from collections import Counter

import lightning.pytorch as pl
import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier, SmallCNN
from tests.conftest import make_trainer
from tests.helpers.small_run import small_datamodule, small_strategy


@pytest.mark.parametrize("precision", ["bf16-true", "64-true"])
def test_a_precision_the_engine_does_not_train_with_is_refused_before_training(precision):
    trainer = make_trainer(small_strategy(), 2, precision=precision)
    module = MLPClassifier()
    weights = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(
        ValueError, match=rf"Trainer\(precision='{precision}'\) is not supported.*'bf16-mixed'"
    ):
        trainer.fit(module, datamodule=small_datamodule())
    assert trainer.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(weights, module.parameters(), strict=True))


class AutocastProbe(SmallCNN):
    """Counts every forward of any copy (the K models, the vectorised executor's template) by
    (train mode, autocast on, output dtype) while armed."""

    armed = False
    calls: Counter = Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if AutocastProbe.armed:
            AutocastProbe.calls[(self.training, torch.is_autocast_enabled("cpu"), out.dtype)] += 1
        return out


class ArmAfterSetup(pl.Callback):
    """Arms the probes when fitting or testing starts: after setup's one-off shape probes, before
    the module's own on_fit_start (the estimation pass)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        AutocastProbe.armed = True

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        AutocastProbe.armed = True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        AutocastProbe.armed = False


@pytest.mark.parametrize(
    "strategy",
    [
        lambda: lf.FedSoftStrategy(num_clusters=2, local_steps=2, selection_size=2, executor="loop"),
        lambda: lf.FedRCStrategy(num_clusters=2, local_steps=2, clients_per_round=4, executor="loop"),
    ],
    ids=["fedsoft", "fedrc"],
)
def test_bf16_mixed_autocasts_every_forward_of_training_and_evaluation(strategy):
    dm = DigitsFederated(num_clients=8, concepts=2, dirichlet_alpha=1.0, seed=0, as_images=True)
    trainer = make_trainer(strategy(), 2, precision="bf16-mixed", callbacks=[ArmAfterSetup()])
    AutocastProbe.calls.clear()
    try:
        trainer.fit(AutocastProbe(), datamodule=dm)
        module = trainer.lightning_module
        trainer.test(module, datamodule=dm, verbose=False)
        calls = Counter(AutocastProbe.calls)
        assert set(calls) == {(True, True, torch.bfloat16), (False, True, torch.bfloat16)}, calls
        x, y = dm.train_split(0)
        losses, outputs = module.evaluate_clusters(x, y)  # a hook-time pass: the plugin's forward context
        assert losses.dtype == outputs.dtype == torch.float32
        assert AutocastProbe.calls[(False, True, torch.bfloat16)] > calls[(False, True, torch.bfloat16)]
    finally:
        AutocastProbe.armed = False


def test_bf16_mixed_trains_the_float32_model_up_to_bfloat16_rounding():
    results = {}
    for precision in ("32-true", "bf16-mixed"):
        torch.manual_seed(0)
        trainer = make_trainer(
            small_strategy(optimizer_state="persist", executor="loop"), 8, precision=precision
        )
        trainer.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=small_datamodule())
        module = trainer.lightning_module
        weights = torch.cat([p.detach().flatten() for p in module.models.parameters()])
        results[precision] = (weights, module.round_metrics["train/loss"], module.eval_metrics)
    (w32, loss32, eval32), (w16, loss16, eval16) = results["32-true"], results["bf16-mixed"]
    gap = float((w32 - w16).abs().max())
    assert 0 < gap < 0.02  # bfloat16 ran (the weights moved), and only by rounding
    assert abs(loss32 - loss16) < 0.01
    assert abs(eval32["val/global_acc"] - eval16["val/global_acc"]) <= 0.05


def test_bf16_mixed_runs_on_the_loop_executor():
    """torch.func's vmap applies no autocast to a no-grad pass: the vectorised executor's E-step
    would stay float32, so "vectorized" is refused by name and "auto" picks the loop. (Flower
    refuses bf16-mixed: tests/flower/test_support.py.)"""
    trainer = make_trainer(small_strategy(executor="vectorized"), 1, precision="bf16-mixed")
    with pytest.raises(ValueError, match=r"executor='vectorized' cannot run.*precision='bf16-mixed'.*'loop'"):
        trainer.fit(MLPClassifier(), datamodule=small_datamodule())
    assert trainer.global_step == 0
    trainer = make_trainer(small_strategy(executor="auto"), 1, precision="bf16-mixed")
    trainer.fit(MLPClassifier(), datamodule=small_datamodule())
    assert trainer.lightning_module.executor == "loop"
    assert make_trainer(small_strategy(executor="auto"), 1).strategy.plan.precision == "32-true"


def test_16_mixed_on_a_cpu_trains_as_bf16_mixed_with_lightnings_warning_as_the_docs_say():
    """Lightning's Trainer turns "16-mixed" on a CPU into "bf16-mixed" (warning), which the engine
    trains; docs/how-to/monitoring.md says so rather than that it is refused."""
    from tests.docs.markdown_blocks import ROOT

    with pytest.warns(
        UserWarning, match=r"AMP with fp16 is not supported on CPU\. Using `precision='bf16-mixed'`"
    ):
        trainer = make_trainer(small_strategy(), 1, precision="16-mixed")
    assert trainer.precision == "bf16-mixed"
    trainer.fit(MLPClassifier(), datamodule=small_datamodule())
    assert trainer.lightning_module.rounds_trained == 1
    page = " ".join((ROOT / "docs" / "how-to" / "monitoring.md").read_text().split())
    assert '"16-mixed" on a CPU is what Lightning itself turns into "bf16-mixed"' in page
    assert '"16-mixed" on a GPU' in page
