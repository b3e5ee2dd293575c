"""The federated strategies' CheckpointIO: checkpoints carry a content hash that loading checks
(a changed byte or a cut-off file is refused before anything is restored, naming the file and the
last good one), and a save that fails (a full disk) leaves the previous checkpoint whole."""

from __future__ import annotations

import errno
import warnings

import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.engine import verified_files
from lightning_fedcluster.engine.verified_files import HASH_KEY, CorruptCheckpointError
from lightning_fedcluster.models import MLPClassifier
from lightning_fedcluster.strategies.checkpoint_io import VerifiedCheckpointIO
from tests.conftest import make_trainer
from tests.flower import workload


def strategy(**options) -> FedRCStrategy:
    return FedRCStrategy(2, clients_per_round=4, local_steps=2, seed=1, **options)


def fit_with_checkpoints(directory, rounds: int = 2, ckpt_path=None, **options):
    saver = ModelCheckpoint(dirpath=directory, save_top_k=-1, save_last=True, save_on_train_epoch_end=True)
    trainer = make_trainer(
        strategy(**options),
        max_epochs=rounds,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[saver],
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=workload.make_datamodule(), ckpt_path=ckpt_path)
    return trainer


def resume(path, rounds: int = 3):
    trainer = make_trainer(strategy(), max_epochs=rounds, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=workload.make_datamodule(), ckpt_path=str(path))
    return trainer


def test_the_strategy_writes_verified_checkpoints_unless_given_its_own_io(tmp_path):
    assert isinstance(strategy().checkpoint_io, VerifiedCheckpointIO)
    own = TorchCheckpointIO()
    assert strategy(checkpoint_io=own).checkpoint_io is own
    fit_with_checkpoints(tmp_path)
    saved = torch.load(tmp_path / "epoch=1-step=2.ckpt", weights_only=False)
    assert saved[HASH_KEY].startswith("sha256:")
    assert verified_files.verify(saved, tmp_path / "epoch=1-step=2.ckpt")
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file is left"


def test_a_checkpoint_with_a_changed_weight_is_refused_naming_the_last_good_one(tmp_path):
    trainer = fit_with_checkpoints(tmp_path)
    bad, good = tmp_path / "epoch=1-step=2.ckpt", tmp_path / "epoch=0-step=1.ckpt"
    weight = trainer.lightning_module.models[0].net[0].weight.detach()[0, 20:24].numpy().tobytes()
    data = bytearray(bad.read_bytes())
    data[data.index(weight) + 1] ^= 0x40
    bad.write_bytes(bytes(data))
    (tmp_path / "last.ckpt").unlink()  # so that the good one beside it is the epoch-0 file
    with pytest.raises(CorruptCheckpointError, match="do not match the content hash") as error:
        resume(bad)
    assert str(bad) in str(error.value) and f"The last good checkpoint beside it is {good}" in str(
        error.value
    )
    assert resume(good).current_epoch == 3, "the named file resumes"


def test_a_truncated_checkpoint_is_refused_by_name(tmp_path):
    fit_with_checkpoints(tmp_path, rounds=1)
    last = tmp_path / "last.ckpt"
    last.write_bytes(last.read_bytes()[: 69_632 % last.stat().st_size])
    with pytest.raises(CorruptCheckpointError, match="cannot be read as a checkpoint.*truncated") as error:
        resume(last)
    assert str(last) in str(error.value) and "epoch=0-step=1.ckpt" in str(error.value)


def test_a_save_that_hits_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    fit_with_checkpoints(tmp_path, rounds=1)
    before = (tmp_path / "last.ckpt").read_bytes()
    save = torch.save

    def fill_disk(obj, file):  # the disk fills while last.ckpt is rewritten
        save(obj, file)
        if ".last.ckpt." in file.name:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(verified_files.torch, "save", fill_disk)
    with pytest.raises(
        OSError,
        match=r"could not write .*last.ckpt \(No space left on device\); the file that was there is unch",
    ):
        fit_with_checkpoints(tmp_path, rounds=2, ckpt_path=tmp_path / "last.ckpt")  # rewrites last.ckpt
    monkeypatch.undo()
    assert (tmp_path / "last.ckpt").read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))
    assert resume(tmp_path / "last.ckpt", rounds=2).current_epoch == 2


def test_a_checkpoint_without_a_hash_loads_with_a_warning(tmp_path):
    fit_with_checkpoints(tmp_path, rounds=1)
    old = tmp_path / "old.ckpt"
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    del saved[HASH_KEY]
    torch.save(saved, old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(old, rounds=2)
    assert any("carries no content hash" in str(w.message) for w in caught)
