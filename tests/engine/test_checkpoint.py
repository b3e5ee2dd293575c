"""engine/checkpoint.py: resuming from a round checkpoint (an epoch's or a step's) equals the
uninterrupted run, including algorithm-specific client state; resuming under another algorithm,
state, solver layout, K or step unit is refused by name; changed round settings are listed."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster import (
    CFLStrategy,
    ConceptDiscovery,
    FedRCStrategy,
    FedSoftStrategy,
)
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.checkpoint import METADATA_KEY
from lightning_fedcluster.engine.verified_files import HASH_KEY
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


@pytest.fixture(scope="module")
def small_digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_resume_at_round_boundary_equals_uninterrupted_run(small_digits, tmp_path):
    def strategy():
        return FedRCStrategy(3, clients_per_round=4, local_steps=2, seed=3)

    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=small_digits)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(
        strategy(), max_epochs=2, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint]
    )
    first.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=small_digits, ckpt_path=str(tmp_path / "last.ckpt"))

    a, b = straight.lightning_module, resumed.lightning_module
    assert resumed.current_epoch == straight.current_epoch == 4
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    for key, value in a.client_state.state_dict().items():
        assert torch.equal(value, b.client_state.state_dict()[key]), key


class StopAfter(pl.Callback):
    """Stop the fit after ``rounds`` rounds (Lightning's ``should_stop``), its length unchanged."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.rounds:
            trainer.should_stop = True


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


@pytest.mark.parametrize("name", ["fedsoft", "fedrc_adam", "cfl", "fedrc_discovery"])
def test_resume_is_exact_with_algorithm_state(digits, tmp_path, name):
    def strategy():
        return {
            "fedsoft": lambda: FedSoftStrategy(2, selection_size=3, local_steps=2, estimation_interval=3),
            "fedrc_adam": lambda: FedRCStrategy(
                3, clients_per_round=5, local_steps=2, config=FedRC.Config(adam_gamma=True),
            ),
            "cfl": lambda: CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6),
            "fedrc_discovery": lambda: FedRCStrategy(  # placements, streaks and fits in the store
                5, discovery=ConceptDiscovery(), clients_per_round=6, local_steps=2
            ),
        }[name]()

    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=digits)
    # The first run is the same 4-round run stopped after round 2 (the policy's triggers read the
    # run's length, max_epochs, as an interrupted run keeps it).
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(
        strategy(), max_epochs=4, limit_val_batches=0, enable_checkpointing=True,
        callbacks=[checkpoint, StopAfter(2)],
    )  # fmt: skip
    first.fit(MLPClassifier(lr=0.2), datamodule=digits)
    assert first.current_epoch == 2
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=digits, ckpt_path=str(tmp_path / "last.ckpt"))
    a, b = straight.lightning_module, resumed.lightning_module
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    state_a, state_b = a.client_state.state_dict(), b.client_state.state_dict()
    assert set(state_a) == set(state_b)
    for key, value in state_a.items():
        assert torch.equal(value, state_b[key]), key


@pytest.fixture
def console(monkeypatch):
    """What Lightning's console logger (``rank_zero_info``) prints, as a list of lines; and the
    SIGINT handler restored after the fit (Lightning ignores Ctrl-C while it shuts down)."""
    import logging
    import signal

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    from lightning_utilities.core import rank_zero

    logger = rank_zero.log  # rank_zero_info's logger (Lightning names it; tests/conftest.py quiets it)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    saved = signal.getsignal(signal.SIGINT)
    yield lines
    signal.signal(signal.SIGINT, saved)
    logger.removeHandler(handler)
    logger.setLevel(level)


class InterruptAt(pl.Callback):
    """Ctrl-C at the start of a round (a KeyboardInterrupt, as Python raises for SIGINT)."""

    def __init__(self, round_index: int) -> None:
        self.round_index = round_index

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.round_index:
            raise KeyboardInterrupt


def test_ctrl_c_says_how_to_resume_from_the_last_round_checkpoint(small_digits, tmp_path, console):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = make_trainer(FedRCStrategy(3, clients_per_round=4, local_steps=1), 5,
                           callbacks=[checkpoint, InterruptAt(2)], enable_checkpointing=True)  # fmt: skip
    with pytest.raises(SystemExit):
        trainer.fit(MLPClassifier(), datamodule=small_digits)
    last = str(tmp_path / "last.ckpt")
    assert (
        f"training stopped in round 3 of 5. To resume from the last round-boundary checkpoint, {last}: "
        f"fedcluster fit <the same arguments> --ckpt_path {last} (Python: trainer.fit(module, "
        f"datamodule=dm, ckpt_path='{last}'))" in "\n".join(console)
    )
    resumed = make_trainer(
        FedRCStrategy(3, clients_per_round=4, local_steps=1), 5, enable_checkpointing=False
    )
    resumed.fit(MLPClassifier(), datamodule=small_digits, ckpt_path=last)
    assert resumed.lightning_module.rounds_trained == 5


def test_ctrl_c_without_a_checkpoint_says_there_is_nothing_to_resume(small_digits, console):

    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=4, local_steps=1), 5, callbacks=[InterruptAt(1)]
    )
    with pytest.raises(SystemExit):
        trainer.fit(MLPClassifier(), datamodule=small_digits)
    assert "training stopped in round 2 of 5 (1 rounds done) and no checkpoint was saved" in "\n".join(
        console
    )


# -- refusals and warnings on resume (moved from the removed step_count tests) ------------------
CLIENTS_PER_ROUND, LOCAL_STEPS = 4, 2


def _datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=8, concepts=2, dirichlet_alpha=1.0, seed=0)


def _strategy(executor: str, **kwargs) -> FedRCStrategy:
    options = dict(
        num_clusters=2, local_steps=LOCAL_STEPS, clients_per_round=CLIENTS_PER_ROUND, executor=executor
    )
    options.update(kwargs)
    return FedRCStrategy(**options)


def test_a_checkpoint_whose_global_step_counted_client_steps_is_refused_for_fit_but_tests(tmp_path):
    """Checkpoints of earlier versions counted client-steps in global_step: resuming one would mix
    the units of max_steps and step-named checkpoints; testing with it reads it as it is."""
    path = _round_checkpoint(_strategy("loop"), tmp_path)
    ckpt = torch.load(path, weights_only=False)
    del ckpt[METADATA_KEY]["global_step"]
    ckpt["global_step"] = CLIENTS_PER_ROUND * LOCAL_STEPS
    del ckpt[HASH_KEY]
    old = tmp_path / "client_steps.ckpt"
    torch.save(ckpt, old)
    resumed = make_trainer(_strategy("loop"), max_epochs=2)
    refusal = r"global_step counted client-steps \(global_step=8 after 1 rounds\)"
    with pytest.raises(ValueError, match=refusal):
        resumed.fit(MLPClassifier(), datamodule=_datamodule(), ckpt_path=old)
    assert resumed.current_epoch == 0
    tested = make_trainer(_strategy("loop"), max_epochs=2).test(
        MLPClassifier(), datamodule=_datamodule(), ckpt_path=old, verbose=False
    )
    assert 0.0 <= tested[0]["test/global_acc"] <= 1.0


def _round_checkpoint(strategy, tmp_path) -> str:
    trainer = make_trainer(strategy, max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(MLPClassifier(), datamodule=_datamodule())
    return trainer.checkpoint_callback.best_model_path


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (
            lambda: lf.FedSoftStrategy(num_clusters=2, local_steps=LOCAL_STEPS),
            "written by FedRC.*trains FedSoft",
        ),
        (lambda: lf.FedEMStrategy(num_clusters=2, local_steps=LOCAL_STEPS), "written by FedRC.*trains FedEM"),
        (
            lambda: _strategy("loop", config=FedRC.Config(adam_gamma=True)),
            "client state holds \\[\\].*keeps \\['adam_m'",
        ),
    ],
)
def test_resuming_under_another_algorithm_or_state_is_refused_by_name(other, message, tmp_path):
    path = _round_checkpoint(_strategy("loop"), tmp_path)
    with pytest.raises(ValueError, match=message):
        make_trainer(other(), max_epochs=2).fit(MLPClassifier(), datamodule=_datamodule(), ckpt_path=path)


def test_a_checkpoint_with_another_solver_layout_is_refused_before_lightning_loads_it(tmp_path):
    """An older checkpoint kept one optimizer group per cluster copy: refused with the way out."""
    path = _round_checkpoint(_strategy("loop"), tmp_path)
    ckpt = torch.load(path, weights_only=False)
    (group,) = ckpt["optimizer_states"][0]["param_groups"]
    half = len(group["params"]) // 2
    per_copy = [{**group, "params": group["params"][:half]}, {**group, "params": group["params"][half:]}]
    ckpt["optimizer_states"][0]["param_groups"] = per_copy
    del ckpt[HASH_KEY]  # written before checkpoints carried a content hash (loaded with a warning)
    old = tmp_path / "old_layout.ckpt"
    torch.save(ckpt, old)
    resumed = make_trainer(_strategy("loop"), max_epochs=2)
    with pytest.raises(ValueError, match=r"groups of \[4, 4\] tensors but this run's local solver has \[8\]"):
        resumed.fit(MLPClassifier(), datamodule=_datamodule(), ckpt_path=old)
    assert resumed.current_epoch == 0


def test_a_diverging_run_warns_once_naming_the_round():
    dm = _datamodule()
    trainer = make_trainer(_strategy("loop"), max_epochs=4)
    with pytest.warns(UserWarning, match=r"round \d+: the training loss .* lower the learning rate"):
        trainer.fit(MLPClassifier(lr=1e6), datamodule=dm)


def test_a_validation_checkpoint_and_a_step_one_both_resume_exactly(tmp_path):
    monitored = ModelCheckpoint(dirpath=tmp_path / "val", monitor="val/global_acc", mode="max", save_top_k=-1)
    stepped = ModelCheckpoint(dirpath=tmp_path / "step", every_n_train_steps=1, save_top_k=-1)
    straight = make_trainer(
        _strategy("loop"), max_epochs=3, enable_checkpointing=True, callbacks=[monitored, stepped]
    )
    straight.fit(MLPClassifier(), datamodule=_datamodule())
    (first,) = (tmp_path / "val").glob("epoch=0-*.ckpt")
    resumed = make_trainer(_strategy("loop"), max_epochs=3)
    resumed.fit(MLPClassifier(), datamodule=_datamodule(), ckpt_path=first)
    expected, got = straight.lightning_module.state_dict(), resumed.lightning_module.state_dict()
    for a, b in zip(expected.values(), got.values(), strict=True):
        assert torch.equal(a, b)
    # A step-based checkpoint (after a round's one batch, inside its epoch) is a round boundary too.
    (after_round_two,) = (tmp_path / "step").glob("*step=2.ckpt")
    resumed = make_trainer(_strategy("loop"), max_epochs=3)
    resumed.fit(MLPClassifier(), datamodule=_datamodule(), ckpt_path=after_round_two)
    for a, b in zip(expected.values(), resumed.lightning_module.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_resuming_with_changed_round_settings_lists_each_change_in_a_warning(tmp_path):
    """The schedule and server step are the strategy's, not the algorithm's: they were changed
    silently on resume (only algorithm options were listed)."""
    path = _round_checkpoint(_strategy("loop"), tmp_path)
    changed = _strategy("loop", local_steps=3, clients_per_round=6, server_lr=0.5)
    with pytest.warns(UserWarning, match="resuming FedRC with a changed configuration") as record:
        make_trainer(changed, max_epochs=2).fit(MLPClassifier(), datamodule=_datamodule(), ckpt_path=path)
    (message,) = [str(w.message) for w in record if "changed configuration" in str(w.message)]
    for change in ("clients_per_round: checkpoint 4 → now 6", "local_steps: checkpoint 2 → now 3",
                   "server_lr: checkpoint 1.0 → now 0.5"):  # fmt: skip
        assert change in message, message
    assert "seed" not in message  # unchanged settings are not listed


def test_resuming_with_another_number_of_clusters_names_both():
    """A K=3 checkpoint resumed with K=4 failed on the optimizer's parameter-group counts."""
    dm = _datamodule()
    trainer = make_trainer(_strategy("loop", num_clusters=3), max_epochs=1, enable_checkpointing=True)
    trainer.fit(MLPClassifier(), datamodule=dm)
    path = trainer.checkpoint_callback.best_model_path
    resumed = make_trainer(_strategy("loop", num_clusters=4), max_epochs=2)
    with pytest.raises(ValueError, match="the checkpoint has K=3 cluster models, this run K=4: resume with "
                                         "num_clusters=3"):  # fmt: skip
        resumed.fit(MLPClassifier(), datamodule=dm, ckpt_path=path)
    with pytest.raises(ValueError, match="the checkpoint has K=3 cluster models, this run K=4"):
        resumed.test(MLPClassifier(), datamodule=dm, ckpt_path=path, verbose=False)


def test_a_checkpoint_records_the_rules_options_from_its_config():
    from lightning_fedcluster.algorithms import CFL, FedRC
    from lightning_fedcluster.engine.checkpoint import algorithm_config

    config = algorithm_config(FedRC(3, adam_gamma=True, label_noise_std=[0.1, 0.2]))
    assert config["num_clusters"] == 3 and config["adam_gamma"] is True and config["use_label_stats"] is True
    assert config["label_noise_std"] == (0.1, 0.2) and "config" not in config  # plain values only
    assert algorithm_config(CFL(4, eps1=0.3)) == {"num_clusters": 4, "eps1": 0.3, "eps2": 1.6}


def test_a_resume_that_changes_the_discovery_policy_is_warned_and_one_without_it_refused(digits, tmp_path):
    def strategy(discovery):
        return FedRCStrategy(4, discovery=discovery, clients_per_round=6, local_steps=2)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(
        strategy(ConceptDiscovery()), max_epochs=2, limit_val_batches=0, enable_checkpointing=True,
        callbacks=[checkpoint],
    )  # fmt: skip
    first.fit(MLPClassifier(lr=0.2), datamodule=digits)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)[METADATA_KEY]["config"]
    assert saved["discovery"] == "ConceptDiscovery(min_share=0.05, gap=0.05)"
    changed = make_trainer(strategy(ConceptDiscovery(gap=0.1)), max_epochs=3, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"discovery: checkpoint .*gap=0.05.* → now .*gap=0.1"):
        changed.fit(MLPClassifier(lr=0.2), datamodule=digits, ckpt_path=str(tmp_path / "last.ckpt"))
    plain = make_trainer(strategy(None), max_epochs=3, limit_val_batches=0)
    with pytest.raises(ValueError, match="client state holds"):
        plain.fit(MLPClassifier(lr=0.2), datamodule=digits, ckpt_path=str(tmp_path / "last.ckpt"))
