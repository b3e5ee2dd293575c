"""What a cluster model's forward may return: logits, or a dict/tuple read through
``logits_from`` (same training as plain logits on both executors); probabilities warn before
training; a bad ``logits_from`` fails before training, naming it."""

from __future__ import annotations

import warnings
from collections import namedtuple

import pytest
import torch
from torch import Tensor

import lightning_fedcluster as lf
from lightning_fedcluster import ClusteredModule
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.outputs import select_logits
from lightning_fedcluster.engine.setup_checks import check_output_shape
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


class DictForward(MLPClassifier):
    def forward(self, x: Tensor) -> dict[str, Tensor]:
        logits = super().forward(x)
        return {"features": x.flatten(1), "logits": logits, "probs": logits.softmax(1)}


class TupleForward(MLPClassifier):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x.flatten(1), super().forward(x)


class SoftmaxForward(MLPClassifier):
    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).softmax(1)


@pytest.fixture(scope="module")
def dm() -> DigitsFederated:
    return DigitsFederated(num_clients=6, concepts=2, seed=0)


def _fit(model, dm, executor: str, module_logits_from=None, **strategy_options) -> ClusteredModule:
    module = ClusteredModule(model, 2, seed=0, logits_from=module_logits_from)
    strategy = lf.FedRCStrategy(2, local_steps=2, clients_per_round=4, executor=executor, **strategy_options)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    assert module.executor == executor
    return module


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_dict_and_tuple_forwards_train_exactly_as_plain_logits(dm, executor):
    plain = _fit(MLPClassifier(lr=0.2), dm, executor)
    by_key = _fit(DictForward(lr=0.2), dm, executor, module_logits_from="logits")
    by_index = _fit(TupleForward(lr=0.2), dm, executor, module_logits_from=-1)  # on the module
    by_callable = _fit(DictForward(lr=0.2), dm, executor, module_logits_from=lambda out: out["logits"])
    for other in (by_key, by_index, by_callable):
        for name, value in plain.state_dict().items():
            assert torch.equal(value, other.state_dict()[name]), name
        for name, value in plain.client_state.state_dict().items():
            assert torch.equal(value, other.client_state.state_dict()[name]), name
    x = dm.train_split(0)[0][:5]
    assert torch.equal(plain(x), by_key(x)) and plain(x).shape == (2, 5, 10)
    initial = ClusteredModule(MLPClassifier(lr=0.2), 2, seed=0)
    moved = any(not torch.equal(a, b) for a, b in zip(initial.parameters(), plain.parameters(), strict=True))
    assert moved  # the comparison is between trained models


def test_a_dict_forward_without_logits_from_says_to_pass_it(dm):
    with pytest.raises(
        ValueError, match=r"returns a dict with keys \['features', 'logits', 'probs'\].*pass logits_from"
    ):
        _fit(DictForward(), dm, "loop")
    with pytest.raises(ValueError, match="returns a tuple of 2 elements.*pass logits_from"):
        _fit(TupleForward(), dm, "loop")


def test_a_bad_logits_from_fails_before_training_naming_it(dm):
    with pytest.raises(
        ValueError, match=r"logits_from='scores' is not a key.*\['features', 'logits', 'probs'\]"
    ):
        _fit(DictForward(), dm, "loop", module_logits_from="scores")
    with pytest.raises(ValueError, match="logits_from=2 is out of range for the 2-element tuple"):
        _fit(TupleForward(), dm, "loop", module_logits_from=2)
    with pytest.raises(ValueError, match="logits_from=.* failed on DictForward.forward's output: KeyError"):
        _fit(DictForward(), dm, "loop", module_logits_from=lambda out: out["missing"])
    with pytest.raises(
        ValueError, match=r"forward \(read through logits_from=0\) must return logits .* got \(8, 64\)"
    ):
        _fit(TupleForward(), dm, "loop", module_logits_from=0)  # the features: wrong width
    with pytest.raises(TypeError, match="logits_from must be"):
        lf.FedRCStrategy(2, logits_from=1.5)
    with pytest.raises(TypeError, match="logits_from must be"):
        ClusteredModule(DictForward(), 2, logits_from=["logits"])


def test_logits_from_lives_on_the_module_and_the_strategy_only_builds_it(dm):
    for strategy_value in ("probs", "logits"):  # a second value, even an equal one, is refused
        with pytest.raises(ValueError, match=r"FedRCStrategy was given logits_from='\w+' but the module is"):
            _fit(DictForward(), dm, "loop", module_logits_from="logits", logits_from=strategy_value)
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=1, logits_from="logits"), max_epochs=1)
    trainer.fit(DictForward(), datamodule=dm)  # a plain LightningModule, wrapped by the strategy
    assert trainer.lightning_module.logits_from == "logits" and trainer.global_step > 0


def _warnings_of(model, dm) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_output_shape(model, dm, Task.CLASSIFICATION)
    return [str(w.message) for w in caught]


def test_probabilities_warn_once_before_training_and_logits_do_not(dm):
    (message,) = _warnings_of(SoftmaxForward(), dm)
    assert "SoftmaxForward.forward seems to return probabilities" in message
    assert "return the logits" in message and "logits_from" in message and "per_sample_loss" in message
    assert _warnings_of(MLPClassifier(), dm) == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_output_shape(DictForward(), dm, Task.CLASSIFICATION, "probs")
        check_output_shape(DictForward(), dm, Task.CLASSIFICATION, "logits")
    assert len([w for w in caught if "probabilities" in str(w.message)]) == 1  # "probs" only
    with pytest.warns(UserWarning, match="seems to return probabilities"):
        _fit(SoftmaxForward(), dm, "loop")


def test_select_logits_reads_keys_indices_attributes_and_callables():
    logits, features = torch.randn(3, 4), torch.randn(3, 2)
    pair = namedtuple("Pair", "features logits")(features, logits)
    assert select_logits(logits, None) is logits
    assert select_logits({"logits": logits}, "logits") is logits
    assert select_logits((features, logits), 1) is logits and select_logits([features, logits], -1) is logits
    assert select_logits(pair, "logits") is logits and select_logits(pair, 1) is logits
    assert select_logits({"out": (features, logits)}, lambda out: out["out"][1]) is logits
    with pytest.raises(ValueError, match="cannot select from a Pair of 2 elements"):
        select_logits(pair, "scores")
    with pytest.raises(ValueError, match="selects a tuple of 2 elements .* not a tensor of logits"):
        select_logits({"out": (features, logits)}, "out")
