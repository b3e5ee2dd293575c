"""strategies/module_options.py: shared_layers and logits_from live on the ClusteredModule; a
strategy's keywords of the same names build the module it wraps around a plain LightningModule
and are refused with a ClusteredModule; the run's seed is the strategy's."""

from __future__ import annotations

import pytest

import lightning_fedcluster as lf
from lightning_fedcluster import ClusteredModule
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from lightning_fedcluster.strategies.module_options import ModuleOptions, clustered_module
from tests.conftest import make_trainer


def test_module_options_normalise_and_say_what_was_given():
    assert ModuleOptions("net.0").shared_layers == ("net.0",)
    assert ModuleOptions().given() == [] and ModuleOptions(("a",), "logits").given() == [
        "shared_layers=('a',)",
        "logits_from='logits'",
    ]
    with pytest.raises(TypeError, match="logits_from must be"):
        ModuleOptions(logits_from=1.5)


def test_a_plain_module_is_built_with_the_options_and_a_clustered_one_kept_as_it_is():
    built = clustered_module(MLPClassifier(hidden=(8,)), 2, 3, ModuleOptions(("net.0",)), "S")
    assert isinstance(built, ClusteredModule) and built.shared_layers == ("net.0",) and built.init_seed == 3
    assert built.models[0].net[0] is built.models[1].net[0]  # tied
    assert clustered_module(built, 2, 3, ModuleOptions(), "S") is built


@pytest.mark.parametrize("options", [{"shared_layers": ("net.0",)}, {"logits_from": 0}])
def test_a_strategy_that_sets_the_modules_settings_too_is_refused_by_name(options):
    module = ClusteredModule(MLPClassifier(hidden=(8,)), 2, shared_layers=("net.0",))
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=1, **options), max_epochs=1)
    name = next(iter(options))
    with pytest.raises(ValueError, match=rf"FedRCStrategy was given {name}=.* pass them to ClusteredModule"):
        trainer.fit(module, datamodule=DigitsFederated(num_clients=4, seed=0))


def test_persistent_optimizer_state_is_refused_with_a_hand_built_modules_shared_layers():
    module = ClusteredModule(MLPClassifier(hidden=(8,)), 2, shared_layers=("net.0",))
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=1, optimizer_state="persist"), max_epochs=1)
    with pytest.raises(ValueError, match="optimizer_state='persist' does not support shared_layers"):
        trainer.fit(module, datamodule=DigitsFederated(num_clients=4, seed=0))


def test_the_runs_seed_is_the_strategys_and_the_modules_seed_initialises_its_copies():
    module = ClusteredModule(MLPClassifier(hidden=(8,)), 2, seed=1)
    assert module.seed == 1  # no run yet: the initialisation seed
    trainer = make_trainer(lf.FedRCStrategy(2, local_steps=1, seed=5), max_epochs=1)
    trainer.fit(module, datamodule=DigitsFederated(num_clients=4, seed=0))
    assert module.init_seed == 1 and module.seed == 5 == module.plan.seed
