"""ScenarioBuilders: `from_tensors` / `from_partition` build the datamodule class asked for."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fedcluster.datamodules import DigitsFederated, FederatedDataModule
from lightning_fedcluster.datamodules.builders import ScenarioBuilders
from tests.datamodules.test_scenario import build


def test_from_tensors_batch_size_and_no_global(digits) -> None:
    dm = build(digits, batch_size=7, global_test_fraction=0.0, corrupt_fraction=0)
    assert dm.batch_size == 7
    assert dm.num_global_clients == 0 and dm.metadata.global_concept.numel() == 0


class PlainSubclass(FederatedDataModule):
    """Keeps FederatedDataModule's constructor, so the builders can build it."""


def test_builders_return_the_class_asked_for_when_it_takes_built_clients(digits) -> None:
    x, y = digits
    parts = [np.arange(0, 60), np.arange(60, 130), np.arange(130, 200)]
    by_tensors = PlainSubclass.from_tensors(x, y, num_clients=4, corrupt_fraction=0, seed=2, val_share=0.3)
    by_parts = PlainSubclass.from_partition(x, y, parts, batch_size=5, adapt_fraction=0.25)
    assert type(by_tensors) is PlainSubclass and type(by_parts) is PlainSubclass
    assert by_tensors.seed == 2 and by_tensors.val_share == 0.3 and by_tensors.num_clients == 4
    assert by_parts.batch_size == 5 and by_parts.adapt_fraction == 0.25 and by_parts.num_clients == 3
    # A subclass with its own constructor cannot take built clients: it gets a FederatedDataModule.
    assert type(DigitsFederated.from_partition(x, y, parts)) is FederatedDataModule


def test_a_class_mixing_in_the_builders_must_say_how_it_is_built(digits) -> None:
    class Unbuildable(ScenarioBuilders):
        pass

    x, y = digits
    with pytest.raises(
        NotImplementedError, match="Unbuildable mixes in ScenarioBuilders but does not define"
    ):
        Unbuildable.from_partition(x, y, [np.arange(0, 50)])


def test_image_shape_serves_flat_rows_as_images_and_a_cnn_on_flat_rows_stops_before_training(digits) -> None:
    """One meaning of image_shape, as with ``fedcluster fit --data FILE --data.image_shape``: the
    flat rows are served as [N, C, H, W] images; without it a convolutional model on the flat rows
    stops before training with the options that give it images, not a raw conv2d error."""
    import torch
    from torch import nn

    from lightning_fedcluster import FedAvgStrategy
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    class RawCNN(MLPClassifier):  # a user's CNN with no input check of its own
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LazyLinear(10))

        def forward(self, x):
            return self.net(x)

    x, y = digits
    images = FederatedDataModule.from_tensors(x, y, num_clients=4, image_shape=(1, 8, 8), seed=0)
    assert images.train_x.shape[1:] == images.global_x.shape[1:] == (1, 8, 8)
    flat = FederatedDataModule.from_tensors(x, y, num_clients=4, corrupt_fraction=0, seed=0)
    assert flat.train_x.shape[1:] == (64,)
    module = RawCNN()
    lazy = nn.UninitializedParameter
    weights = [p.detach().clone() for p in module.parameters() if not isinstance(p, lazy)]
    trainer = make_trainer(FedAvgStrategy(clients_per_round=2, local_steps=1), 1)
    message = r"RawCNN has 2-D convolutions but FederatedDataModule serves flat inputs \(\d+, 64\): "
    with pytest.raises(ValueError, match=message + r".*image_shape=\(C, H, W\) in FederatedDataModule"):
        trainer.fit(module, datamodule=flat)
    assert trainer.global_step == 0
    kept = [p for p in module.parameters() if not isinstance(p, lazy)]
    assert all(torch.equal(a, b) for a, b in zip(weights, kept, strict=True))
    make_trainer(FedAvgStrategy(clients_per_round=2, local_steps=1), 1).fit(RawCNN(), datamodule=images)


def test_from_tensors_under_the_authors_preset_takes_their_evaluation_split(digits) -> None:
    """docs/data-sets.md: the preset's client test share is 0.1 and a global client adapts on 0.9
    of its rows, as in the vision datamodules; from_tensors kept 0.2 and 0.4."""
    x, y = digits
    common = dict(num_clients=25, concepts=3, image_shape=(1, 8, 8), seed=0)
    authors = FederatedDataModule.from_tensors(x, y, preset="authors", **common)
    assert authors.adapt_fraction == 0.9
    held_out = (authors.val_sizes + authors.test_sizes).sum() / (
        authors.train_sizes + authors.val_sizes + authors.test_sizes
    ).sum()
    assert float(held_out) == pytest.approx(0.1, abs=0.01)
    paper = FederatedDataModule.from_tensors(x, y, **common)
    assert paper.adapt_fraction == 0.4
    assert float(
        (paper.val_sizes + paper.test_sizes).sum()
        / (paper.train_sizes + paper.val_sizes + paper.test_sizes).sum()
    ) == pytest.approx(0.2, abs=0.01)
    # Given explicitly, they win over the preset.
    given = FederatedDataModule.from_tensors(
        x, y, preset="authors", test_fraction=0.3, adapt_fraction=0.5, **common
    )
    assert given.adapt_fraction == 0.5


def test_hugging_face_sources_name_the_extra_when_it_is_missing(monkeypatch) -> None:
    import subprocess
    import sys

    code = "import sys, lightning_fedcluster; print(sorted({'datasets', 'flwr_datasets'} & set(sys.modules)))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"  # the library imports neither until a data set is built
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"need the `hf` extra .*lightning-fedcluster\[hf\]"):
        FederatedDataModule.from_hugging_face("data.parquet", features="x", label="y", partitioner=None)
