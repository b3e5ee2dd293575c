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
