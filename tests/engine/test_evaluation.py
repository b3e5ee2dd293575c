"""Validation and test score disjoint rows, and an unseen client's mixture weights are fitted on
its adapt rows and scored on the others."""

from __future__ import annotations

import math

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import ClientMetadata, DigitsFederated
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


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 64, generator=generator), torch.randint(0, 10, (n,), generator=generator)


def _tested(dm: lf.FederatedDataModule) -> dict[str, float]:
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=1), max_epochs=1, limit_val_batches=0)
    module = lf.ClusteredModule(MLPClassifier(), 2)
    trainer.fit(module, datamodule=dm)
    return trainer.test(module, datamodule=dm, verbose=False)[0]


def test_no_global_clients_give_a_nan_global_accuracy_with_a_warning_naming_the_cause():
    dm = lf.FederatedDataModule(
        [_rows(20, i) for i in range(4)], [_rows(6, 10 + i) for i in range(4)], [], num_classes=10
    )
    with pytest.warns(
        UserWarning, match=r"test/global_acc: the datamodule has no global \(unseen\) test clients"
    ):
        metrics = _tested(dm)
    assert math.isnan(metrics["test/global_acc"])
    assert not math.isnan(metrics["test/local_acc"])


def test_clients_without_test_rows_give_nan_not_zero_local_accuracy_with_a_warning():
    dm = lf.FederatedDataModule(
        [_rows(20, i) for i in range(4)],
        [_rows(0, 10 + i) for i in range(4)],
        [_rows(30, 20)],
        num_classes=10,
    )
    with pytest.warns(UserWarning, match="test/local_acc: no participating client has test rows"):
        metrics = _tested(dm)
    assert math.isnan(metrics["test/local_acc"])  # was 0.0: an accuracy over no rows at all


def test_a_global_client_with_one_row_is_scored_on_the_prior_and_one_without_test_rows_is_named():
    """One row: it goes to test (validation takes floor(0.5 * 1) = 0) and is scored, adapting on
    nothing (the mixture prior); this crashed in the E-step of zero rows. The validation pass has
    no row of it to score: its metric is NaN, named in a warning, and left out of the mean."""
    dm = lf.FederatedDataModule(
        [_rows(20, i) for i in range(4)],
        [_rows(6, 10 + i) for i in range(4)],
        [_rows(1, 20), _rows(30, 21)],
        num_classes=10,
        metadata=ClientMetadata(torch.zeros(4, dtype=torch.long), ["clean"] * 4, torch.tensor([0, 1])),
    )
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=1), max_epochs=1)
    module = lf.ClusteredModule(MLPClassifier(), 2)
    with pytest.warns(
        UserWarning, match=r"val/global_acc_concept0: global client\(s\) \[0\] have no validation rows"
    ):
        trainer.fit(module, datamodule=dm)
    val = trainer.callback_metrics
    assert val["val/global_acc"] == val["val/global_acc_concept1"]  # the mean of the one scored client
    test = trainer.test(module, datamodule=dm, verbose=False)[0]
    assert test["test/global_acc_concept0"] in (0.0, 1.0)  # its one row, scored
