"""Lightning's accounting on both executors: global_step counts client-steps, ModelCheckpoint
writes a file per round by default, max_steps stops (and a cut round is discarded), mid-round
and cross-algorithm checkpoints are refused by name, a diverging run warns."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.verified_files import HASH_KEY
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

ROUNDS, CLIENTS_PER_ROUND, LOCAL_STEPS = 3, 4, 2


def _datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=8, concepts=2, dirichlet_alpha=1.0, seed=0)


def _strategy(executor: str, **kwargs) -> lf.FedRCStrategy:
    options = dict(
        num_clusters=2, local_steps=LOCAL_STEPS, clients_per_round=CLIENTS_PER_ROUND, executor=executor
    )
    options.update(kwargs)
    return lf.FedRCStrategy(**options)


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_global_step_counts_client_steps_and_a_checkpoint_lands_every_round(executor, tmp_path):
    dm = _datamodule()
    trainer = pl.Trainer(
        strategy=_strategy(executor),
        accelerator="cpu",
        devices=1,
        max_epochs=ROUNDS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)],
    )
    trainer.fit(MLPClassifier(), datamodule=dm)
    assert trainer.lightning_module.executor == executor
    assert trainer.global_step == ROUNDS * CLIENTS_PER_ROUND * LOCAL_STEPS
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(files) == ROUNDS, files
    metrics = trainer.test(datamodule=dm, verbose=False)  # ckpt_path="best" by default: needs a checkpoint
    assert 0.0 <= metrics[0]["test/global_acc"] <= 1.0


def test_default_executor_writes_checkpoints_and_trainer_test_works_as_the_readme_shows(tmp_path):
    dm = _datamodule()
    trainer = pl.Trainer(
        strategy=lf.FedRCStrategy(
            num_clusters=2, local_steps=LOCAL_STEPS, clients_per_round=CLIENTS_PER_ROUND
        ),
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(MLPClassifier(), datamodule=dm)
    assert trainer.lightning_module.executor == "vectorized"  # "auto" on an all-Linear model
    assert trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path
    assert trainer.global_step == 2 * CLIENTS_PER_ROUND * LOCAL_STEPS
    assert "test/local_acc" in trainer.test(datamodule=dm, verbose=False)[0]


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_every_n_train_steps_fires_and_max_steps_stops(executor, tmp_path):
    steps_per_round = CLIENTS_PER_ROUND * LOCAL_STEPS
    dm = _datamodule()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=steps_per_round, save_top_k=-1)
    trainer = make_trainer(
        _strategy(executor),
        max_epochs=-1,
        max_steps=2 * steps_per_round,
        enable_checkpointing=True,
        callbacks=[saver],
    )
    trainer.fit(MLPClassifier(), datamodule=dm)
    assert trainer.current_epoch == 2 and trainer.global_step == 2 * steps_per_round
    assert len(list(tmp_path.iterdir())) >= 2


def test_max_steps_inside_a_round_keeps_the_last_aggregated_weights(tmp_path):
    steps_per_round = CLIENTS_PER_ROUND * LOCAL_STEPS
    dm = _datamodule()
    whole = make_trainer(_strategy("loop"), max_epochs=1)
    whole.fit(MLPClassifier(), datamodule=dm)
    cut = make_trainer(_strategy("loop"), max_epochs=-1, max_steps=steps_per_round + 3)
    with pytest.warns(UserWarning, match="stopped inside round 1"):
        cut.fit(MLPClassifier(), datamodule=dm)
    straight, stopped = whole.lightning_module.state_dict(), cut.lightning_module.state_dict()
    for a, b in zip(straight.values(), stopped.values(), strict=True):
        assert torch.equal(a, b)


def test_a_mid_round_checkpoint_is_refused_by_name(tmp_path):
    dm = _datamodule()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer = make_trainer(_strategy("loop"), max_epochs=1, enable_checkpointing=True, callbacks=[saver])
    trainer.fit(MLPClassifier(), datamodule=dm)
    mid_round = sorted(tmp_path.iterdir())[0]
    resumed = make_trainer(_strategy("loop"), max_epochs=2)
    with pytest.raises(ValueError, match="middle of round 0.*round-boundary checkpoint"):
        resumed.fit(MLPClassifier(), datamodule=dm, ckpt_path=mid_round)


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
        (lambda: _strategy("loop", adam_gamma=True), "client state holds \\[\\].*keeps \\['adam_m'"),
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


def test_a_validation_checkpoint_resumes_exactly_and_a_step_one_at_a_round_end_is_refused(tmp_path):
    monitored = ModelCheckpoint(dirpath=tmp_path / "val", monitor="val/global_acc", mode="max", save_top_k=-1)
    stepped = ModelCheckpoint(dirpath=tmp_path / "step", every_n_train_steps=CLIENTS_PER_ROUND * LOCAL_STEPS)
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
    # A step-based checkpoint at a round's last step lies inside the round's epoch: refused.
    (at_round_end,) = (tmp_path / "step").glob("*.ckpt")
    with pytest.raises(ValueError, match="round-boundary checkpoint"):
        make_trainer(_strategy("loop"), max_epochs=3).fit(
            MLPClassifier(), datamodule=_datamodule(), ckpt_path=at_round_end
        )


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_global_step_counts_the_client_steps_of_unequal_clients_on_both_executors(executor):
    """With local_epochs, clients of different sizes run different step counts: global_step is
    their sum (the loop executor counted every client at the largest one's steps)."""
    dm = _datamodule()
    strategy = lf.FedRCStrategy(2, local_epochs=1, executor=executor, clients_per_chunk=3)
    trainer = make_trainer(strategy, max_epochs=2)
    trainer.fit(MLPClassifier(), datamodule=dm)
    batches = [-(-int(n) // dm.batch_size) for n in dm.train_sizes]
    assert len(set(batches)) > 1, batches  # the case: unequal step counts
    assert trainer.global_step == 2 * sum(batches)


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
