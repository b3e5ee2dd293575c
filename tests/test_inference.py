"""inference.py: predicting for any client: hard prediction, a new client's fitted ω, and the
mixture prior for clients without labels."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster import (
    ClusteredModule,
    FedEMStrategy,
    FedRCStrategy,
)
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.inference import mixture_prior
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.weights import cluster_weights


@pytest.fixture(scope="module")
def small_digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_explicit_clustered_module_and_hard_prediction(small_digits):
    module = ClusteredModule(MLPClassifier(lr=0.2), num_clusters=2, seed=1)
    trainer = make_trainer(
        FedRCStrategy(2, hard_prediction=True, clients_per_round=6, local_steps=2),
        max_epochs=2,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=small_digits)
    assert trainer.lightning_module is module
    metrics = trainer.test(module, datamodule=small_digits, verbose=False)[0]
    assert set(metrics) >= {"test/local_acc", "test/global_acc", "test/concept_ari"}
    x, y = small_digits.global_split(0)
    omega = module.adapt(x, y)
    assert omega.shape == (2,) and float(omega.sum()) == pytest.approx(1.0)
    probs = module.predict_proba(x, omega)
    # Hard prediction: the probabilities are exactly one cluster model's softmax.
    chosen = int(omega.argmax())
    torch.testing.assert_close(probs, torch.softmax(module.models[chosen](x), dim=1))


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_new_client_predictor_for_every_soft_method(digits):
    trainer = make_trainer(
        FedEMStrategy(3, clients_per_round=6, local_steps=2), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    x, y = digits.global_split(0)
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
    module = ClusteredModule(MLPClassifier(), 3)
    x, y = torch.rand(5, 64), torch.randint(0, 10, (5,))
    with pytest.raises(RuntimeError, match=rf"{caller} needs a trained ClusteredModule.*trainer.fit\(module"):
        call(module, x, y)
