"""Bad input fails before training with a message that names the argument."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster import ClusteredModule, FederatedDataModule, FedRCStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


class TrainingCounter(MLPClassifier):
    """Counts forward calls in train mode, to prove no local step ran."""

    steps = 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            TrainingCounter.steps += 1
        return super().forward(x)


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=8, seed=0)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_num_clusters_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="num_clusters"):
        FedRCStrategy(num_clusters=value)
    with pytest.raises(ValueError, match="num_clusters"):
        ClusteredModule(MLPClassifier(), num_clusters=value)


@pytest.mark.parametrize("name", ["clients_per_round", "local_steps", "local_epochs"])
def test_schedule_arguments_must_be_positive(name):
    with pytest.raises(ValueError, match=name):
        FedRCStrategy(3, **{name: 0})


def test_local_steps_and_local_epochs_are_exclusive():
    with pytest.raises(ValueError, match="local_steps or local_epochs"):
        FedRCStrategy(3, local_steps=2, local_epochs=1)


def test_too_many_clients_per_round_fails_before_training(digits):
    TrainingCounter.steps = 0
    trainer = make_trainer(FedRCStrategy(3, clients_per_round=9), max_epochs=1)
    with pytest.raises(ValueError, match=r"clients_per_round=9 .* \(8\)"):
        trainer.fit(TrainingCounter(), datamodule=digits)
    assert TrainingCounter.steps == 0 and trainer.global_step == 0


def test_module_output_must_match_the_label_count(digits):
    trainer = make_trainer(FedRCStrategy(2), max_epochs=1)
    with pytest.raises(ValueError, match=r"num_classes.*\[batch, 10\].*got \(8, 7\)"):
        trainer.fit(MLPClassifier(num_classes=7), datamodule=digits)
    assert trainer.global_step == 0


def test_empty_client_is_rejected():
    x, y = torch.rand(10, 4), torch.randint(0, 3, (10,))
    empty = (torch.empty(0, 4), torch.empty(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"client_train\[1\] is empty"):
        FederatedDataModule([(x, y), empty], [(x, y), (x, y)], num_classes=3)


def test_labels_outside_the_class_range_are_rejected():
    x, y = torch.rand(10, 4), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    with pytest.raises(ValueError, match="num_classes"):
        FederatedDataModule([(x, y)], [(x, y)], num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        FederatedDataModule([(x, y - 1)], [(x, y)], num_classes=4)


def test_module_and_strategy_must_agree_on_num_clusters(digits):
    trainer = make_trainer(FedRCStrategy(3), max_epochs=1)
    with pytest.raises(ValueError, match="num_clusters=3.*2 cluster models"):
        trainer.fit(ClusteredModule(MLPClassifier(), num_clusters=2), datamodule=digits)


def test_a_plain_datamodule_is_rejected_with_the_fix():
    import lightning.pytorch as pl

    class Plain(pl.LightningDataModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(4, 64)))

    trainer = make_trainer(FedRCStrategy(3), max_epochs=1)
    with pytest.raises(TypeError, match="FederatedDataModule"):
        trainer.fit(MLPClassifier(), datamodule=Plain())


class NaNOnClientFour(MLPClassifier):
    """A model whose loss is NaN on the inputs of one client (its first training row)."""

    poisoned: torch.Tensor | None = None

    def per_sample_loss(self, batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y, reduction="none")
        hit = (x.unsqueeze(1) == self.poisoned.unsqueeze(0)).all(2).any(1)
        return torch.where(hit, torch.full_like(loss, float("nan")), loss)


def test_non_finite_loss_names_the_round_and_client():
    # NaN in the data itself is refused before training (tests/datamodules/test_validation.py);
    # here the model's loss is NaN on client 4's data only.
    dm = DigitsFederated(num_clients=6, seed=0)
    NaNOnClientFour.poisoned = dm.train_split(4)[0][:1].clone()
    trainer = make_trainer(FedRCStrategy(2, local_steps=2), max_epochs=2)
    with pytest.raises(FloatingPointError, match="round 1 at client 4"):
        trainer.fit(NaNOnClientFour(), datamodule=dm)


class InfiniteTrainingLoss(MLPClassifier):
    """Finite in the E-step pass (no grad), infinite in local training: divergence on cue."""

    def per_sample_loss(self, batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y, reduction="none")
        return loss * float("inf") if torch.is_grad_enabled() else loss


def test_diverging_training_names_the_round_client_and_local_step():
    dm = DigitsFederated(num_clients=6, seed=0)
    trainer = make_trainer(FedRCStrategy(1, local_steps=2), max_epochs=2)
    with pytest.raises(FloatingPointError, match=r"round 1 at client 0 at local step 0"):
        trainer.fit(InfiniteTrainingLoss(), datamodule=dm)


@pytest.mark.parametrize("seed", [-1, 2**32, 1.0, None])
def test_seed_must_fit_the_seed_mixer(seed):
    with pytest.raises(ValueError, match="seed must be an integer"):
        FedRCStrategy(3, seed=seed)
    with pytest.raises(ValueError, match="seed must be an integer"):
        ClusteredModule(MLPClassifier(), num_clusters=2, seed=seed)
