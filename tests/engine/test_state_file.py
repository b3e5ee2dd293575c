"""optimizer_state_dir: the persistent optimizer-state store in a file, read and written one
client at a time, with the same results as the in-memory store."""

from __future__ import annotations

import copy

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.state_file import OptimizerStateFile
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vectors_round_trip_bit_for_bit_and_reads_are_copies(tmp_path, dtype):
    store = OptimizerStateFile(tmp_path, dtype)
    first, second = torch.randn(1000), torch.randn(1000)
    first[0], first[1] = -0.0, float("nan")
    store[7], store[2] = first, second
    assert list(store) == [7, 2] and len(store) == 2 and 5 not in store
    assert torch.equal(store[7].view(torch.uint8), first.to(dtype).view(torch.uint8))  # -0.0 and NaN kept
    assert store[2].dtype == dtype and torch.equal(store[2], second.to(dtype))
    read = store[7]
    read.zero_()  # a read is the caller's own tensor
    assert torch.equal(store[7].view(torch.uint8), first.to(dtype).view(torch.uint8))
    store[7] = second  # overwrite: the same slot, the other client untouched
    assert torch.equal(store[7], second.to(dtype)) and torch.equal(store[2], second.to(dtype))
    assert list(store) == [7, 2]
    with pytest.raises(ValueError, match="1000 values"):
        store[3] = torch.zeros(999)
    del store[7]  # a forgotten client's slot is never handed to another client
    store[9] = first
    assert sorted(store) == [2, 9] and torch.equal(store[2], second.to(dtype))


def test_the_file_has_no_name_and_copies_are_independent(tmp_path):
    store = OptimizerStateFile(tmp_path)
    store[0] = torch.arange(4.0)
    assert list(tmp_path.iterdir()) == []  # an unnamed temporary file: nothing left behind, even on a crash
    twin = copy.deepcopy(store)
    twin[0] = torch.zeros(4)
    assert torch.equal(store[0], torch.arange(4.0)) and torch.equal(twin[0], torch.zeros(4))
    store.clear()
    assert len(store) == 0 and len(twin) == 1
    store[1] = torch.ones(6)  # a cleared store takes a new vector length
    assert torch.equal(store[1], torch.ones(6))


def _dm() -> DigitsFederated:
    return DigitsFederated(num_clients=6, concepts=2, seed=0)


def _fit(executor: str, rounds: int, state_dir=None, **trainer_options):
    strategy = lf.FedRCStrategy(
        num_clusters=2, local_steps=2, clients_per_round=4, executor=executor, optimizer_state="persist",
        optimizer_state_dir=state_dir,
    )  # fmt: skip
    trainer = make_trainer(strategy, max_epochs=rounds, **trainer_options)
    trainer.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=_dm())
    return trainer


def _assert_same_run(one, two) -> None:
    for key, value in one.lightning_module.state_dict().items():
        assert torch.equal(value, two.lightning_module.state_dict()[key]), key
    first, second = (
        one.lightning_module.client_state.state_dict(),
        two.lightning_module.client_state.state_dict(),
    )
    assert set(first) == set(second) and "optimizer.vectors" in first
    for key, value in first.items():
        assert torch.equal(value, second[key]), key


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_a_run_with_the_store_in_a_file_equals_the_run_in_memory(executor, tmp_path):
    memory, in_file = _fit(executor, 3), _fit(executor, 3, state_dir=tmp_path)
    store = in_file.lightning_module.client_state.optimizer
    assert isinstance(store, OptimizerStateFile) and len(store) >= 4
    _assert_same_run(memory, in_file)


def test_a_file_store_resumes_exactly_from_a_round_checkpoint(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    straight = _fit("loop", 4, state_dir=state_dir)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    _fit("loop", 2, state_dir=state_dir, enable_checkpointing=True, callbacks=[saver])
    (checkpoint,) = (tmp_path / "ckpt").glob("epoch=1-*.ckpt")
    strategy = lf.FedRCStrategy(
        num_clusters=2, local_steps=2, clients_per_round=4, executor="loop", optimizer_state="persist",
        optimizer_state_dir=str(state_dir),
    )  # fmt: skip
    resumed = make_trainer(strategy, max_epochs=4)
    resumed.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=_dm(), ckpt_path=checkpoint)
    assert isinstance(resumed.lightning_module.client_state.optimizer, OptimizerStateFile)
    _assert_same_run(straight, resumed)


def test_a_bad_optimizer_state_dir_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="optimizer_state_dir=.*optimizer_state='persist'"):
        lf.FedRCStrategy(2, optimizer_state_dir=tmp_path)
    with pytest.raises(ValueError, match="optimizer_state_dir=.*is not a directory: create it first"):
        lf.FedRCStrategy(2, optimizer_state="persist", optimizer_state_dir=tmp_path / "missing")
    with pytest.raises(TypeError, match="optimizer_state_dir must be a directory path, got int"):
        lf.FedRCStrategy(2, optimizer_state="persist", optimizer_state_dir=3)
