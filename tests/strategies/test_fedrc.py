"""The engine end to end on real data: exactness against a plain loop, concept separation,
checkpoint resume, TensorBoard output, and the public API forms."""

from __future__ import annotations

import copy

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_fedcluster import ClusteredModule, FedRCStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.reference_fedrc import reference_fedrc


@pytest.fixture(scope="module")
def small_digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


@pytest.mark.parametrize("num_clusters", [1, 3])
def test_engine_matches_plain_pytorch_fedrc(small_digits, num_clusters):
    """K=3: FedRC; K=1: FedAvg. Same seeds, same schedule: the weights must agree."""
    module = ClusteredModule(MLPClassifier(lr=0.2), num_clusters, seed=0)
    initial = [copy.deepcopy(m) for m in module.models]
    strategy = FedRCStrategy(num_clusters, clients_per_round=5, local_steps=3, seed=0)
    trainer = make_trainer(strategy, max_epochs=3, limit_val_batches=0)
    trainer.fit(module, datamodule=small_digits)
    expected, omega, sums = reference_fedrc(small_digits, initial, rounds=3, clients_per_round=5,
                                            local_steps=3, lr=0.2, seed=0)
    for got, want in zip(module.models, expected, strict=True):
        for p, q in zip(got.parameters(), want.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.client_state.omega, omega, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(module.client_state.label_sums, sums, rtol=1e-5, atol=1e-6)
    if num_clusters == 1:
        assert torch.all(module.client_state.omega == 1.0)


def test_fedrc_separates_three_concepts_that_fedavg_cannot_fit():
    """The issue's acceptance test: K=3 beats K=1 (FedAvg) by >= 25 points of global accuracy
    and recovers the concepts (ARI >= 0.8). Setting = the `fedcluster fit` main job."""
    dm = DigitsFederated(num_clients=30, concepts=3, seed=0)
    results = {}
    for k in (3, 1):
        strategy = FedRCStrategy(k, clients_per_round=10, local_steps=5, seed=0)
        trainer = make_trainer(strategy, max_epochs=150, limit_val_batches=0)
        trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
        results[k] = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    gap = results[3]["test/global_acc"] - results[1]["test/global_acc"]
    assert gap >= 0.25, results
    assert results[3]["test/concept_ari"] >= 0.8, results
    assert results[1]["test/concept_ari"] == pytest.approx(0.0)


def test_resume_at_round_boundary_equals_uninterrupted_run(small_digits, tmp_path):
    def strategy():
        return FedRCStrategy(3, clients_per_round=4, local_steps=2, seed=3)

    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=small_digits)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(strategy(), max_epochs=2, limit_val_batches=0, enable_checkpointing=True,
                         callbacks=[checkpoint])
    first.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=small_digits, ckpt_path=str(tmp_path / "last.ckpt"))

    a, b = straight.lightning_module, resumed.lightning_module
    assert resumed.current_epoch == straight.current_epoch == 4
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    for key, value in a.client_state.state_dict().items():
        assert torch.equal(value, b.client_state.state_dict()[key]), key


def test_tensorboard_gets_round_metrics_and_cluster_images(small_digits, tmp_path):
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="run")
    trainer = make_trainer(FedRCStrategy(3, clients_per_round=6, local_steps=2), max_epochs=3,
                           logger=logger, check_val_every_n_epoch=1)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    for tag in ("train/loss", "train/acc", "val/local_acc", "val/global_acc", "val/concept_ari"):
        assert tag in scalars, scalars
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3], tag
    assert "clusters/concept0_share_in_cluster0" in scalars
    losses = [e.value for e in events.Scalars("train/loss")]
    assert losses[-1] < losses[0]
    images = events.Tags()["images"]
    for tag in ("clusters/omega_clients_by_concept", "clusters/label_stats_C", "clusters/concept_shares"):
        assert tag in images, images
    omega_image = events.Images("clusters/omega_clients_by_concept")[-1]
    assert omega_image.width >= 400 and omega_image.step == 3


def test_explicit_clustered_module_and_hard_prediction(small_digits):
    module = ClusteredModule(MLPClassifier(lr=0.2), num_clusters=2, seed=1)
    trainer = make_trainer(FedRCStrategy(2, hard_prediction=True, clients_per_round=6, local_steps=2),
                           max_epochs=2, limit_val_batches=0)
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


def test_cluster_copies_start_different_and_user_module_is_untouched():
    user = MLPClassifier()
    before = {k: v.clone() for k, v in user.state_dict().items()}
    module = ClusteredModule(user, num_clusters=3, seed=0)
    first = [p for p in module.models[0].parameters()][0]
    second = [p for p in module.models[1].parameters()][0]
    assert not torch.equal(first, second)
    assert all(torch.equal(before[k], v) for k, v in user.state_dict().items())
    again = ClusteredModule(MLPClassifier(), num_clusters=3, seed=0)
    assert torch.equal(first, [p for p in again.models[0].parameters()][0])
