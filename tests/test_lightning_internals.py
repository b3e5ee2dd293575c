"""lightning_internals.py: the contract with the installed Lightning (every private name the
package uses exists), the launchers a federated strategy builds in place of Lightning's (same
settings, no state copied), and the hyper-parameters' name an export writes."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from lightning.pytorch.strategies import launchers as lightning_launchers

import lightning_fedcluster as lf
from lightning_fedcluster import lightning_internals
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.strategies.launchers import MultiProcessingLauncher, ScriptLauncher
from tests.conftest import make_trainer


def test_every_lightning_internal_the_package_uses_exists_in_the_installed_lightning():
    assert lightning_internals.internals_problems() == []
    lightning_internals.check_internals()


def test_a_missing_internal_fails_naming_the_lightning_version_and_the_name(monkeypatch):
    monkeypatch.delattr(lightning_launchers, "_SubprocessScriptLauncher")
    with pytest.raises(RuntimeError) as caught:
        lightning_internals.check_internals()
    assert f"lightning {pl.__version__}" in str(caught.value)
    assert "lightning.pytorch.strategies.launchers._SubprocessScriptLauncher is missing" in str(caught.value)


def test_a_removed_attribute_fails_naming_it(monkeypatch):
    monkeypatch.setattr(
        lightning_internals,
        "INTERNALS",
        (("lightning.pytorch.strategies", "DDPStrategy", ("_launcher", "_no_such_name")),),
    )
    assert lightning_internals.internals_problems() == [
        "lightning.pytorch.strategies.DDPStrategy has no _no_such_name"
    ]


@pytest.mark.parametrize(
    ("start_method", "kind", "lightning_kind"),
    [
        ("popen", ScriptLauncher, lightning_internals.ScriptLaunch),
        ("spawn", MultiProcessingLauncher, lightning_internals.SpawnLaunch),
    ],
)
def test_a_federated_strategy_gets_lightnings_launcher_built_anew_as_its_environment_keeping_subclass(
    start_method, kind, lightning_kind
):
    strategy = lf.FederatedStrategy(algorithm=FedRC(2), local_steps=1, start_method=start_method)
    trainer = make_trainer(strategy, max_epochs=1, devices=2)
    launcher = trainer.strategy.launcher
    assert type(launcher) is kind and isinstance(launcher, lightning_kind)  # Lightning's checks hold
    plain = pl.Trainer(
        strategy=pl.strategies.DDPStrategy(start_method=start_method),
        accelerator="cpu",
        devices=2,
        logger=False,
    ).strategy.launcher
    assert type(plain) is lightning_kind
    if start_method == "popen":
        assert type(launcher.cluster_environment) is type(plain.cluster_environment)
        assert (launcher.num_processes, launcher.num_nodes) == (plain.num_processes, plain.num_nodes)
        assert (launcher.num_processes, launcher.num_nodes) == (2, 1)
    if start_method == "spawn":
        assert lightning_internals.start_method(launcher) == "spawn"
        assert launcher._strategy is trainer.strategy
        assert launcher.is_interactive_compatible == plain.is_interactive_compatible


def test_a_launcher_of_another_kind_is_left_as_it_is():
    strategy = lf.FederatedStrategy(algorithm=FedRC(2), local_steps=1)
    other = object()
    assert strategy.replace_launcher(other) is other and strategy.replace_launcher(None) is None


class OneArgument(pl.LightningModule):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.save_hyperparameters(config)


class Keywords(pl.LightningModule):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_the_hyperparameters_name_is_the_one_save_hyperparameters_gave():
    assert lightning_internals.hparams_name(OneArgument({"a": 1})) == "config"
    assert lightning_internals.hparams_name(Keywords()) == "kwargs"
    assert lightning_internals.hparams_name(pl.LightningModule()) is None
