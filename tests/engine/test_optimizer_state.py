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


def _round_states(monkeypatch, in_store: bool | None) -> list:
    """Every RoundState the engine opens; ``in_store=False`` keeps the [clients, state] buffer
    even on one process (the multi-process path)."""
    from lightning_fedcluster.engine import federation
    from lightning_fedcluster.engine.round import RoundState

    opened = []

    class Recorded(RoundState):
        def __init__(self, *args, **kwargs) -> None:
            if in_store is not None:
                kwargs["optimizer_in_store"] = in_store
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(federation, "RoundState", Recorded)
    return opened


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_one_process_writes_into_the_store_bit_identical_to_the_round_buffer(executor, monkeypatch):
    opened = _round_states(monkeypatch, None)
    direct = _fit(executor, "persist", rounds=3)
    assert len(opened) == 3 and all(r.optimizer is None for r in opened)  # no [clients, state] buffer
    opened = _round_states(monkeypatch, False)
    buffered = _fit(executor, "persist", rounds=3)
    assert len(opened) == 3 and all(r.optimizer is not None for r in opened)
    for a, b in zip(_weights(direct).values(), _weights(buffered).values(), strict=True):
        assert torch.equal(a, b)
    one = direct.lightning_module.client_state.state_dict()
    two = buffered.lightning_module.client_state.state_dict()
    assert set(one) == set(two) and "optimizer.vectors" in one
    for key, value in one.items():
        assert torch.equal(value, two[key]), key


@pytest.mark.parametrize(
    ("dtype", "name", "eps"), [(torch.bfloat16, "bfloat16", 2**-8), (torch.float16, "float16", 2**-11)]
)
def test_a_reduced_precision_store_holds_its_dtype_and_round_trips_within_its_precision(
    dtype, name, eps, tmp_path
):
    from lightning_fedcluster.engine.optimizer_state import load_state

    exact = _fit("loop", "persist", rounds=1)
    strategy = lf.FedRCStrategy(
        num_clusters=2, local_steps=2, clients_per_round=4, executor="loop", optimizer_state="persist",
        optimizer_state_dtype=name,
    )  # fmt: skip
    saver = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    half = make_trainer(strategy, max_epochs=1, enable_checkpointing=True, callbacks=[saver])
    half.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=_dm())
    # Round 1 starts without state, so both runs train the same: the store is the float32 state rounded.
    for a, b in zip(_weights(exact).values(), _weights(half).values(), strict=True):
        assert torch.equal(a, b)
    one, two = exact.lightning_module.client_state, half.lightning_module.client_state
    assert sorted(one.optimizer) == sorted(two.optimizer) and len(two.optimizer) == 4
    assert torch.equal(one.optimizer_started, two.optimizer_started)
    for client, vector in two.optimizer.items():
        assert vector.dtype == dtype and vector.element_size() == 2
        assert torch.equal(vector, one.optimizer[client].to(dtype))
        error = (vector.float() - one.optimizer[client]).abs()
        assert bool((error <= eps * one.optimizer[client].abs() + 2**-24).all())
        assert float(error.max()) > 0  # really rounded, not kept in float32
    (checkpoint,) = tmp_path.glob("*.ckpt")
    assert (
        torch.load(checkpoint, weights_only=False)["fedcluster_client_state"]["optimizer.vectors"].dtype
        == dtype
    )
    # Loading a client's state gives the local optimizer float32 buffers equal to the stored values.
    module = half.lightning_module
    optimizer = torch.optim.SGD([p for m in module.models for p in m.parameters()], lr=0.05, momentum=0.9)
    client = sorted(two.optimizer)[0]
    load_state(optimizer, module.optimizer_layout, two.optimizer[client], two.optimizer_started[client])
    for entry in module.optimizer_layout.entries:
        buffer = optimizer.state[optimizer.param_groups[0]["params"][entry.param]][entry.key]
        assert buffer.dtype == torch.float32
        stored = two.optimizer[client][entry.offset : entry.offset + entry.numel].float()
        assert torch.equal(buffer.flatten(), stored)


def test_the_vectorised_executor_reads_and_writes_a_bfloat16_store():
    strategy = lf.FedRCStrategy(
        num_clusters=2, local_steps=2, clients_per_round=4, executor="vectorized", optimizer_state="persist",
        optimizer_state_dtype="bfloat16",
    )  # fmt: skip
    half = make_trainer(strategy, max_epochs=3)
    half.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=_dm())
    exact = _fit("vectorized", "persist", rounds=3)
    one, two = exact.lightning_module.client_state, half.lightning_module.client_state
    assert sorted(one.optimizer) == sorted(two.optimizer)
    for client, vector in two.optimizer.items():
        assert vector.dtype == torch.bfloat16
        # rounds 2-3 start from rounded momentum: close to the float32 run, not equal
        torch.testing.assert_close(vector.float(), one.optimizer[client], rtol=0.05, atol=1e-3)


def test_bad_optimizer_state_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="optimizer_state_dtype must be one of .*'half'"):
        lf.FedRCStrategy(2, optimizer_state="persist", optimizer_state_dtype="half")
    with pytest.raises(ValueError, match="optimizer_state_dtype='bfloat16' applies to .*'persist'"):
        lf.FedRCStrategy(2, optimizer_state_dtype="bfloat16")  # reset stores nothing
