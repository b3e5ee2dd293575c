"""strategies/batch_limits.py: Lightning's batch limits either mean something for rounds
(``fast_dev_run``) or are refused by name before training."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.small_run import small_datamodule, small_strategy


@pytest.mark.parametrize(
    ("flag", "value", "advice"),
    [
        ("limit_train_batches", 0.5, "clients_per_round"),
        ("limit_train_batches", 0, "max_epochs"),
        ("overfit_batches", 2, "overfit_batches=2"),
    ],
)
def test_batch_limits_that_would_cut_rounds_are_refused_before_training(flag, value, advice):
    trainer = make_trainer(small_strategy(), 2, **{flag: value})
    module = MLPClassifier()
    with pytest.raises(ValueError, match=advice):
        trainer.fit(module, datamodule=small_datamodule())
    assert trainer.global_step == 0


def test_a_limit_that_allows_the_rounds_one_batch_trains_whole_rounds():
    dm = small_datamodule()
    whole = make_trainer(small_strategy(), 2)
    whole.fit(MLPClassifier(), datamodule=dm)
    limited = make_trainer(small_strategy(), 2, limit_train_batches=3)
    limited.fit(MLPClassifier(), datamodule=dm)
    assert limited.global_step == whole.global_step == 2  # one step per round
    one, two = whole.lightning_module.state_dict(), limited.lightning_module.state_dict()
    for a, b in zip(one.values(), two.values(), strict=True):
        assert torch.equal(a, b)


def test_fast_dev_run_trains_one_round_and_evaluates_every_client():
    dm = small_datamodule()
    trainer = make_trainer(small_strategy(executor="vectorized"), 5, fast_dev_run=True)
    trainer.fit(MLPClassifier(), datamodule=dm)
    assert trainer.current_epoch == 1 and trainer.global_step == 1  # one whole round
    # the validation inside fit scored every client (cut after one item, the unseen ones read 0.0)
    metrics = trainer.lightning_module.eval_metrics
    assert metrics["val/global_acc"] > 0.0 and metrics["val/local_acc"] > 0.0
    assert all(metrics[f"val/global_acc_concept{c}"] > 0.0 for c in range(2))
    tested = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    assert tested["test/global_acc"] > 0.0 and tested["test/local_acc"] > 0.0
