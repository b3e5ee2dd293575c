"""Validation and test score disjoint rows, and an unseen client's mixture weights are fitted on
its adapt rows and scored on the others."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine import evaluation
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_validation_and_test_use_their_own_rows_and_unseen_clients_never_score_adapt_rows(monkeypatch):
    dm = DigitsFederated(num_clients=6, concepts=2, seed=0)
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=2), max_epochs=1)
    module = lf.ClusteredModule(MLPClassifier(), 2)
    trainer.fit(module, datamodule=dm)

    scored: list[tuple[int, int]] = []
    adapted: list[torch.Tensor] = []
    original_add = evaluation.Evaluation.add
    original_mixture = module.rule.unseen_client_mixture

    def add(self, slot, prediction, y, task):
        scored.append((slot, y.shape[0]))
        return original_add(self, slot, prediction, y, task)

    def mixture(losses, labels, *args, **kwargs):
        adapted.append(labels.clone())
        return original_mixture(losses, labels, *args, **kwargs)

    monkeypatch.setattr(evaluation.Evaluation, "add", add)
    monkeypatch.setattr(type(module.rule), "unseen_client_mixture", lambda self, *a, **k: mixture(*a, **k))
    for stage, run in (("val", trainer.validate), ("test", trainer.test)):
        scored.clear()
        adapted.clear()
        run(module, datamodule=dm, verbose=False)
        local = sum(n for slot, n in scored if slot == 0)
        _, _, local_offsets = dm.evaluation_split(stage, "local")
        sizes = dm.val_sizes if stage == "val" else dm.test_sizes
        assert local == int(local_offsets[-1]) == int(sizes.sum())
        _, adapt_y, adapt_offsets = dm.evaluation_split(stage, "global_adapt")
        _, _, score_offsets = dm.evaluation_split(stage, "global_score")
        for g in range(dm.num_global_clients):
            assert torch.equal(adapted[g], adapt_y[int(adapt_offsets[g]) : int(adapt_offsets[g + 1])])
            assert (2 + 2 * g, int(score_offsets[g + 1] - score_offsets[g])) in scored
    # Validation and test rows differ (disjointness of the rows themselves is a datamodule test).
    assert dm.evaluation_split("val", "local")[2][-1] > 0 and dm.evaluation_split("test", "local")[2][-1] > 0


def test_testing_untrained_models_warns_and_trained_ones_do_not():
    """trainer.test before fit, or after a fit of max_epochs=0, scores the initial weights: a
    warning says so; after one round there is none. The test scores' step is the rounds trained."""
    import warnings

    import pytest

    dm = DigitsFederated(num_clients=6, concepts=2, seed=0)
    strategy = lf.FedAvgStrategy(clients_per_round=3, local_steps=1)
    untrained = r"testing models that no client has trained yet \(trainer.test before trainer.fit, or a fit"
    with pytest.warns(UserWarning, match=untrained):
        scores = make_trainer(strategy, 1).test(lf.ClusteredModule(MLPClassifier()), datamodule=dm)[0]
    assert scores["step"] == 0.0
    trainer = make_trainer(lf.FedAvgStrategy(clients_per_round=3, local_steps=1), 0)
    trainer.fit(MLPClassifier(), datamodule=dm)
    with pytest.warns(UserWarning, match=untrained):
        trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)
    trainer = make_trainer(lf.FedAvgStrategy(clients_per_round=3, local_steps=1), 1)
    trainer.fit(MLPClassifier(), datamodule=dm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    assert not [w for w in caught if "no client has trained" in str(w.message)]
    assert scores["step"] == 1.0


def test_validate_returns_the_metrics_it_logs_and_a_fit_logs_them_once():
    """``trainer.validate()`` returns the validation metrics (it returned ``[{}]``); during a fit
    they stay off Lightning's logger (the ClusterMonitor logs them with the round as the step)."""
    dm = DigitsFederated(num_clients=6, concepts=2, seed=0)
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=2), max_epochs=1)
    module = lf.ClusteredModule(MLPClassifier(), 2)
    trainer.fit(module, datamodule=dm)
    assert "val/local_acc" not in trainer.logged_metrics
    (results,) = trainer.validate(module, datamodule=dm, verbose=False)
    assert set(results) == {*module.eval_metrics, "step"} and "val/local_acc" in results
    assert results["step"] == 1.0, "logged at the rounds trained, as the test scores"
    for name, value in module.eval_metrics.items():
        assert results[name] == pytest.approx(value, abs=1e-6), name
