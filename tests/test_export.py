"""cluster_module and export_clusters: cluster k's trained model as the user's own class, and a
Lightning checkpoint per cluster that the user's load_from_checkpoint reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.export import EXPORT_KEY
from tests.conftest import make_trainer


class TwoPartNet(LightningModule):
    """Written as Lightning's docs write a module: hyper-parameters saved, a feature extractor
    and a head (shared_layers can share the extractor)."""

    def __init__(self, width: int = 32, lr: float = 0.1, tag: str = "default") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(nn.Linear(64, width), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=6, concepts=2, seed=0)


def _fit(datamodule, shared_layers=()):
    strategy = lf.FedRCStrategy(2, local_steps=2, shared_layers=shared_layers)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(TwoPartNet(width=12, lr=0.05, tag="mine"), datamodule=datamodule)
    return trainer.lightning_module


@pytest.fixture(scope="module")
def trained(digits):
    return _fit(digits)


def test_cluster_module_is_the_users_class_with_cluster_k_weights(trained, digits):
    x = digits.test_x[:20]
    outputs = [trained.models[k](x) for k in range(2)]
    assert not torch.allclose(outputs[0], outputs[1])
    for k in range(2):
        copy = trained.cluster_module(k)
        assert type(copy) is TwoPartNet and copy._trainer is None
        assert dict(copy.hparams) == {"width": 12, "lr": 0.05, "tag": "mine"}
        torch.testing.assert_close(copy(x), outputs[k])
        with torch.no_grad():  # a copy: changing it leaves the trained cluster alone
            copy.head.weight.zero_()
        torch.testing.assert_close(trained.models[k](x), outputs[k])
    with pytest.raises(ValueError, match="cluster index in 0..1"):
        trained.cluster_module(2)


def test_exported_checkpoints_load_with_the_users_load_from_checkpoint(trained, digits, tmp_path):
    paths = trained.export_clusters(tmp_path / "clusters")
    assert sorted(paths) == [0, 1]
    x = digits.test_x[:20]
    for k, path in paths.items():
        assert path == tmp_path / "clusters" / f"cluster_{k}.ckpt"
        loaded = TwoPartNet.load_from_checkpoint(path)
        assert dict(loaded.hparams) == {"width": 12, "lr": 0.05, "tag": "mine"}
        assert loaded.head.in_features == 12
        torch.testing.assert_close(loaded(x), trained.models[k](x))
        assert torch.load(path, weights_only=True)[EXPORT_KEY] == {"cluster": k, "num_clusters": 2}


def test_export_with_shared_layers_carries_the_shared_extractor(digits, tmp_path):
    module = _fit(digits, shared_layers=("features",))
    assert module.models[0].features is module.models[1].features
    x = digits.test_x[:20]
    paths = module.export_clusters(tmp_path)
    loaded = [TwoPartNet.load_from_checkpoint(paths[k]) for k in range(2)]
    for k in range(2):
        torch.testing.assert_close(loaded[k](x), module.models[k](x))
    torch.testing.assert_close(loaded[0].features[0].weight, loaded[1].features[0].weight)
    assert loaded[0].features is not loaded[1].features
    assert not torch.allclose(loaded[0].head.weight, loaded[1].head.weight)


def test_removed_clusters_are_refused_and_skipped(digits, tmp_path):
    module = _fit(digits)
    module.client_state.remove_clusters(torch.tensor([False, True]))
    with pytest.raises(ValueError, match="cluster 1 is inactive"):
        module.cluster_module(1)
    with pytest.warns(UserWarning, match=r"skips clusters \[1\]"):
        paths = module.export_clusters(tmp_path)
    assert sorted(paths) == [0] and sorted(p.name for p in tmp_path.iterdir()) == ["cluster_0.ckpt"]
