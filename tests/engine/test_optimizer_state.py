"""optimizer_state="persist": each (client, cluster) optimizer state survives rounds and
checkpoints, equals between executors, and changes training only where state exists."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def _dm() -> DigitsFederated:
    return DigitsFederated(num_clients=6, concepts=2, seed=0)


def _fit(executor: str, optimizer_state: str, rounds: int = 3, momentum: float = 0.9, **trainer_options):
    strategy = lf.FedRCStrategy(
        num_clusters=2, local_steps=2, clients_per_round=4, executor=executor, optimizer_state=optimizer_state
    )
    trainer = make_trainer(strategy, max_epochs=rounds, **trainer_options)
    trainer.fit(MLPClassifier(lr=0.05, momentum=momentum), datamodule=_dm())
    return trainer


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.lightning_module.state_dict().items()}


def test_persist_keeps_every_trained_clients_momentum_and_changes_training():
    reset, persist = _fit("loop", "reset"), _fit("loop", "persist")
    state = persist.lightning_module.client_state
    trained = state.seen.nonzero().flatten().tolist()
    assert sorted(state.optimizer) == trained and len(trained) >= 4
    assert bool(state.optimizer_started[trained].all())  # FedRC trains both clusters
    layout = persist.lightning_module.optimizer_layout
    assert layout.size == 2 * sum(p.numel() for p in MLPClassifier().parameters())  # one buffer per parameter
    assert all(float(state.optimizer[c].abs().sum()) > 0 for c in trained)
    assert reset.lightning_module.client_state.optimizer == {}
    pairs = zip(_weights(reset).values(), _weights(persist).values(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)


def test_persist_without_optimizer_state_is_reset_exactly():
    reset, persist = _fit("loop", "reset", momentum=0.0), _fit("loop", "persist", momentum=0.0)
    assert persist.lightning_module.optimizer_layout.size == 0  # plain SGD keeps no state
    for a, b in zip(_weights(reset).values(), _weights(persist).values(), strict=True):
        assert torch.equal(a, b)


def test_the_vectorised_executor_persists_the_same_momentum_as_the_loop():
    loop, vectorized = _fit("loop", "persist"), _fit("vectorized", "persist")
    assert vectorized.lightning_module.executor == "vectorized"
    for a, b in zip(_weights(loop).values(), _weights(vectorized).values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    one, two = loop.lightning_module.client_state, vectorized.lightning_module.client_state
    assert sorted(one.optimizer) == sorted(two.optimizer)
    assert torch.equal(one.optimizer_started, two.optimizer_started)
    for client, vector in one.optimizer.items():
        torch.testing.assert_close(vector, two.optimizer[client], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_persistent_state_resumes_exactly_from_a_round_checkpoint(executor, tmp_path):
    straight = _fit(executor, "persist", rounds=4)
    saver = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    _fit(executor, "persist", rounds=2, enable_checkpointing=True, callbacks=[saver])
    (checkpoint,) = tmp_path.glob("epoch=1-*.ckpt")
    stored = torch.load(checkpoint, weights_only=False)["fedcluster_client_state"]
    assert "optimizer.vectors" in stored and stored["optimizer.vectors"].shape[0] >= 4
    strategy = lf.FedRCStrategy(
        num_clusters=2, local_steps=2, clients_per_round=4, executor=executor, optimizer_state="persist"
    )
    resumed = make_trainer(strategy, max_epochs=4)
    resumed.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=_dm(), ckpt_path=checkpoint)
    for a, b in zip(_weights(straight).values(), _weights(resumed).values(), strict=True):
        assert torch.equal(a, b)
    for key, value in straight.lightning_module.client_state.state_dict().items():
        assert torch.equal(value, resumed.lightning_module.client_state.state_dict()[key]), key


def test_bad_optimizer_state_is_refused_by_name():
    with pytest.raises(ValueError, match="optimizer_state must be one of"):
        lf.FedRCStrategy(2, optimizer_state="keep")
    with pytest.raises(ValueError, match="shared_layers"):
        lf.FedRCStrategy(2, optimizer_state="persist", shared_layers=("net.0",))
