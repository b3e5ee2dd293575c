"""prediction.py: trainer.predict and module.predict: every client predicted with its own mixture
weights (the evaluation's mixture), global clients with the ω adapted on their labels; on both
executors and every way a Lightning user calls predict. A new client's fitted ω, hard
prediction, and the mixture prior for clients without labels."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated, FedSoftSynthetic
from lightning_fedcluster.datamodules.loaders import EvaluationChunk, empty_clients
from lightning_fedcluster.models import LinearRegressor, MLPClassifier
from lightning_fedcluster.prediction import ClientInputs, concat_predictions, mixture_prior
from tests.conftest import make_trainer
from tests.helpers.weights import cluster_weights


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=6, concepts=2, seed=0)


def _fit(datamodule, executor: str = "loop", strategy=None, **trainer_options):
    strategy = strategy or lf.FedRCStrategy(2, local_steps=2, executor=executor)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0, **trainer_options)
    user = MLPClassifier(hidden=(16,))
    trainer.fit(user, datamodule=datamodule)
    return trainer, user


@pytest.fixture(scope="module", params=["loop", "vectorized"])
def fitted(request, digits):
    trainer, user = _fit(digits, request.param)
    assert trainer.lightning_module.executor == request.param
    return trainer, user


def _check_datamodule_predictions(out, module, dm) -> None:
    """Every participating client's test rows with its own ω; every global client's score rows
    with the ω the rule fits on its adapt rows and labels."""
    assert set(out) == {"client", "global_client", "row", "target", "omega", "probs", "preds"}
    state = module.client_state
    assert (out["client"] >= 0).sum() == dm.test_x.shape[0]
    for i in range(dm.num_clients):
        rows = out["client"] == i
        x, y = dm.test_split(i)
        assert torch.equal(out["target"][rows], y)
        assert torch.equal(
            out["row"][rows], dm.evaluation_rows("test", "local")[dm.test_offsets[i] : dm.test_offsets[i + 1]]
        )
        torch.testing.assert_close(out["omega"][rows], state.omega[i].expand(len(y), -1))
        torch.testing.assert_close(out["probs"][rows], module.predict_proba(x, state.omega[i]).cpu())
        assert torch.equal(out["preds"][rows], out["probs"][rows].argmax(1))
    adapt_x, adapt_y, adapt_offsets = dm.evaluation_split("test", "global_adapt")
    score_x, score_y, score_offsets = dm.evaluation_split("test", "global_score")
    for g in range(dm.num_global_clients):
        rows = out["global_client"] == g
        a, b = int(adapt_offsets[g]), int(adapt_offsets[g + 1])
        omega = module.new_client(adapt_x[a:b], adapt_y[a:b]).omega
        assert not torch.allclose(omega, module.mixture_prior())  # the labels moved it off the prior
        torch.testing.assert_close(out["omega"][rows], omega.expand(int(rows.sum()), -1).cpu())
        s, e = int(score_offsets[g]), int(score_offsets[g + 1])
        assert torch.equal(out["target"][rows], score_y[s:e])
        torch.testing.assert_close(out["probs"][rows], module.predict_proba(score_x[s:e], omega).cpu())


def test_trainer_predict_gives_each_client_its_own_mixture(fitted, digits):
    trainer, _ = fitted
    module = trainer.lightning_module
    out = concat_predictions(trainer.predict(module, datamodule=digits))
    _check_datamodule_predictions(out, module, digits)
    padding = module.predict_step(EvaluationChunk(empty_clients()), 0)  # several processes pad
    assert set(padding) == set(out) and all(len(value) == 0 for value in padding.values())
    assert padding["probs"].shape == (0, 10) and padding["omega"].shape == (0, 2)
    # The rows and predictions are the ones trainer.test scores.
    metrics = trainer.test(module, datamodule=digits, verbose=False)[0]
    local = out["client"] >= 0
    accuracy = (out["preds"][local] == out["target"][local]).double().mean()
    assert float(accuracy) == pytest.approx(metrics["test/local_acc"], abs=1e-6)
    for g in range(digits.num_global_clients):
        rows = out["global_client"] == g
        concept = int(digits.metadata.global_concept[g])
        accuracy = (out["preds"][rows] == out["target"][rows]).double().mean()
        assert float(accuracy) == pytest.approx(metrics[f"test/global_acc_concept{concept}"], abs=1e-6)


def test_predict_with_the_users_own_module_uses_the_trained_clusters(fitted, digits):
    trainer, user = fitted
    module = trainer.lightning_module
    expected = concat_predictions(trainer.predict(module, datamodule=digits))
    out = concat_predictions(trainer.predict(user, datamodule=digits))
    assert trainer.lightning_module is module  # the same trained wrapper, not fresh copies
    torch.testing.assert_close(out["probs"], expected["probs"])


def test_trainer_predict_without_a_model_loads_the_checkpoint(digits, tmp_path):
    trainer, _ = _fit(digits, enable_checkpointing=True, default_root_dir=tmp_path)
    module = trainer.lightning_module
    expected = concat_predictions(trainer.predict(module, datamodule=digits))
    with torch.no_grad():  # spoil the weights and client state held in memory
        for parameter in module.models.parameters():
            parameter.zero_()
    module.client_state.omega.fill_(0.5)
    with pytest.warns(UserWarning, match="best model of the previous `fit`"):
        out = concat_predictions(trainer.predict(datamodule=digits))
    torch.testing.assert_close(out["probs"], expected["probs"])
    torch.testing.assert_close(out["omega"], expected["omega"])
    _check_datamodule_predictions(out, module, digits)


def test_predict_on_tensors_with_client_ids(fitted, digits):
    trainer, _ = fitted
    module = trainer.lightning_module
    omega, prior = module.client_state.omega, module.mixture_prior()
    x = digits.test_x[:40]
    ids = torch.tensor([0] * 10 + [3] * 10 + [-1] * 10 + [5] * 10)
    loader = DataLoader(ClientInputs(x, ids), batch_size=16)
    out = concat_predictions(trainer.predict(module, dataloaders=loader))
    assert torch.equal(out["client"], ids)
    for client, rows in ((0, slice(0, 10)), (3, slice(10, 20)), (5, slice(30, 40))):
        torch.testing.assert_close(out["probs"][rows], module.predict_proba(x[rows], omega[client]).cpu())
        torch.testing.assert_close(out["omega"][rows], omega[client].expand(10, -1))
        assert torch.equal(module.predict(x[rows], client=client), out["preds"][rows])
    # A client without labels: the prior, the participating clients' ω weighted by training samples.
    torch.testing.assert_close(out["probs"][20:30], module.predict_proba(x[20:30], prior).cpu())
    torch.testing.assert_close(module.predict_proba(x[20:30]), module.predict_proba(x[20:30], prior))
    sizes = digits.train_sizes.double()
    torch.testing.assert_close(prior.cpu(), (sizes[:, None] * omega).sum(0) / sizes.sum())
    # Plain inputs (a tensor or a one-tensor dataset) are rows of clients without labels.
    plain = concat_predictions(
        trainer.predict(module, dataloaders=DataLoader(TensorDataset(x), batch_size=16))
    )
    torch.testing.assert_close(plain["probs"], module.predict_proba(x, prior).cpu())
    assert torch.equal(plain["client"], torch.full((40,), -1))


def test_predict_refuses_ambiguous_batches_and_bad_client_ids(fitted, digits):
    trainer, _ = fitted
    module = trainer.lightning_module
    x, y = digits.test_x[:8], digits.test_y[:8]
    with pytest.raises(TypeError, match="labels or client ids"):
        trainer.predict(module, dataloaders=DataLoader(TensorDataset(x, y), batch_size=4))
    with pytest.raises(ValueError, match="participating clients 0..5 or -1"):
        module.predict(x, client=digits.num_clients)
    with pytest.raises(ValueError, match="one id per row"):
        module.predict_proba(x, client=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="either omega or client"):
        module.predict_proba(x, module.mixture_prior(), client=0)


@pytest.mark.parametrize(
    "strategy",
    [
        lambda: lf.FedSoftStrategy(2, selection_size=3, local_steps=2),
        lambda: lf.FedRCStrategy(2, local_steps=2, finetune_epochs=1),
    ],
    ids=["fedsoft-personal", "fedrc-ft"],
)
def test_per_client_models_predict_as_the_evaluation_scores_them(digits, strategy):
    """FedSoft predicts participating clients with their personal models, FedRC-FT with models
    fine-tuned on their data: on the datamodule's rows and on tensors with their client id alike."""
    trainer, _ = _fit(digits, strategy=strategy())
    module = trainer.lightning_module
    out = concat_predictions(trainer.predict(module, datamodule=digits))
    metrics = trainer.test(module, datamodule=digits, verbose=False)[0]
    local = out["client"] >= 0
    accuracy = (out["preds"][local] == out["target"][local]).double().mean()
    assert float(accuracy) == pytest.approx(metrics["test/local_acc"], abs=1e-6)
    client = next(iter(module.client_state.personal), 1)
    x, _ = digits.test_split(client)
    own = module.predict_proba(x, client=client)
    torch.testing.assert_close(own.cpu(), out["probs"][out["client"] == client])
    assert not torch.allclose(own, module.predict_proba(x, module.client_state.omega[client]))


def test_predict_warns_for_untrained_cluster_models(digits):
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=2), max_epochs=1)
    with pytest.warns(UserWarning, match="took part in no training round"):
        trainer.predict(MLPClassifier(hidden=(16,)), datamodule=digits)


def test_regression_predictions_are_what_the_test_scores():
    dm = FedSoftSynthetic(
        num_clients=6, pattern="10:90", min_samples=30, max_samples=40, global_test_size=60, seed=0
    )
    trainer = make_trainer(lf.FedEMStrategy(2, local_steps=3), max_epochs=2, limit_val_batches=0)
    trainer.fit(LinearRegressor(10, 1, bias=False, optimizer="adam", lr=0.05), datamodule=dm)
    module = trainer.lightning_module
    out = concat_predictions(trainer.predict(module, datamodule=dm))
    assert "probs" not in out and out["preds"].shape == (out["target"].shape[0], 1)
    metrics = trainer.test(module, datamodule=dm, verbose=False)[0]
    local = out["client"] >= 0
    mse = (out["preds"][local].squeeze(1).double() - out["target"][local].double()).square().mean()
    assert float(mse) == pytest.approx(metrics["test/local_mse"], rel=1e-5)
    x, _ = dm.test_split(2)
    torch.testing.assert_close(out["preds"][out["client"] == 2], module.predict(x, client=2).cpu())


class _DigitCNN(lf.models.ClassifierSteps):
    """A small CNN on the 8x8 digits (the engine's loop executor, as any convolutional model)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.view(-1, 1, 8, 8))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_an_early_cnn_run_fits_a_new_clients_mixture_in_few_iterations():
    """Two rounds into a CNN run the K models' losses are nearly equal: the likelihood of ω is
    flat and its optimum near one-hot, where SQUAREM on ω overshot, fell back to plain E-steps and
    took 4,023 of its 5,000 iterations on this client (the cap on others). On log ω it converges
    in a few dozen, to a certified optimum or within the flat tolerance of it."""
    from lightning_fedcluster.algorithms.mixture import FLAT_TOLERANCE, fit_mixture, likelihood_gap

    dm = DigitsFederated(num_clients=10, seed=0)
    trainer = make_trainer(lf.FedRCStrategy(5, local_steps=5), max_epochs=2, limit_val_batches=0)
    trainer.fit(_DigitCNN(), datamodule=dm)
    module = trainer.lightning_module
    x, y = dm.global_split(0)
    losses, _ = module.evaluate_clusters(x, y)
    stats = module.current_label_stats()
    spread = (losses - losses.mean(1, keepdim=True)).abs().mean()
    assert spread < 0.2 * losses.mean()  # the case: nearly equal losses across the clusters
    fit = fit_mixture(losses, y, stats)
    assert fit.iterations <= 100, fit.iterations
    scores = -losses.double() - stats.double()[y]
    gap = likelihood_gap(scores, fit.omega)  # below the maximum mean log-likelihood by at most this
    assert gap <= 1e-12 or y.numel() * gap <= FLAT_TOLERANCE
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "did not converge"
        omega = module.new_client(x, y).omega
    torch.testing.assert_close(omega, fit.omega)


@pytest.fixture(scope="module")
def twelve_clients():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_explicit_clustered_module_and_hard_prediction(twelve_clients):
    module = lf.ClusteredModule(MLPClassifier(lr=0.2), num_clusters=2, seed=1)
    trainer = make_trainer(
        lf.FedRCStrategy(2, config=FedRC.Config(hard_prediction=True), clients_per_round=6, local_steps=2),
        max_epochs=2,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=twelve_clients)
    assert trainer.lightning_module is module
    metrics = trainer.test(module, datamodule=twelve_clients, verbose=False)[0]
    assert set(metrics) >= {"test/local_acc", "test/global_acc", "test/concept_ari"}
    x, y = twelve_clients.global_split(0)
    omega = module.adapt(x, y)
    assert omega.shape == (2,) and float(omega.sum()) == pytest.approx(1.0)
    probs = module.predict_proba(x, omega)
    # Hard prediction: the probabilities are exactly one cluster model's softmax.
    chosen = int(omega.argmax())
    torch.testing.assert_close(probs, torch.softmax(module.models[chosen](x), dim=1))


def test_new_client_predictor_for_every_soft_method(twelve_clients):
    trainer = make_trainer(
        lf.FedEMStrategy(3, clients_per_round=6, local_steps=2), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=twelve_clients)
    module = trainer.lightning_module
    x, y = twelve_clients.global_split(0)
    before = cluster_weights(module)
    predictor = module.new_client(x, y)
    assert predictor.omega.shape == (3,) and float(predictor.omega.sum()) == pytest.approx(1.0)
    probs = predictor.predict_proba(x)
    assert probs.shape == (len(y), 10) and torch.allclose(probs.sum(1), torch.ones(len(y), dtype=probs.dtype))
    assert torch.equal(predictor.predict(x), probs.argmax(1))
    # Inputs of another shape than the training data's: the fix, not torch's matrix shapes.
    with pytest.raises(ValueError, match=r"takes 64 features per sample but gets 8 .*Give inputs shaped"):
        module.new_client(x[:, :8], y)
    assert all(torch.equal(a, b) for a, b in zip(before, cluster_weights(module), strict=True))


def test_mixture_prior_by_hand():
    omega = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    sizes, seen = torch.tensor([10, 20, 30]), torch.tensor([True, True, False])
    active = torch.ones(3, dtype=torch.bool)
    prior = mixture_prior(omega, sizes, seen, active)
    torch.testing.assert_close(prior, torch.tensor([20 / 30, 10 / 30, 0.0], dtype=torch.float64))
    only_first = mixture_prior(omega, sizes, seen, torch.tensor([True, False, True]))
    torch.testing.assert_close(only_first, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    none_seen = mixture_prior(
        omega, sizes, torch.zeros(3, dtype=torch.bool), torch.tensor([True, False, True])
    )
    torch.testing.assert_close(none_seen, torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64))


@pytest.mark.parametrize(
    ("call", "caller"),
    [
        (lambda m, x, y: m.new_client(x, y), "new_client / adapt"),
        (lambda m, x, y: m.adapt(x, y), "new_client / adapt"),
        (lambda m, x, y: m.predict(x, torch.full((3,), 1 / 3)), "predict / predict_proba"),
        (lambda m, x, y: m.predict_proba(x), "predict / predict_proba"),
    ],
)
def test_inference_before_any_fit_says_to_fit_first(call, caller):
    """These ended in a bare AssertionError (new_client, adapt) or 'not attached to a Trainer'."""
    module = lf.ClusteredModule(MLPClassifier(), 3)
    x, y = torch.rand(5, 64), torch.randint(0, 10, (5,))
    with pytest.raises(RuntimeError, match=rf"{caller} needs a trained ClusteredModule.*trainer.fit\(module"):
        call(module, x, y)
