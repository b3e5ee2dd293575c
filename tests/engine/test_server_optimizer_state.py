"""server_optimizer="momentum" | "adam" (Reddi et al. 2021): the per-cluster server step follows
its formulas, is the same on both executors, and survives checkpoints exactly
(the math and the argument checks: tests/algorithms/test_server_optimizer.py)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizer
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def _step(optimizer: ServerOptimizer, theta: torch.Tensor, delta: torch.Tensor, weight: float, lr: float):
    optimizer.step("cluster0", [theta], [delta.double() * weight], weight, lr)


def test_momentum_accumulates_the_averaged_update_across_rounds():
    optimizer = ServerOptimizer(ServerOptimizerConfig("momentum", momentum=0.5))
    theta = torch.zeros(3)
    d1, d2 = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.0, 1.0, 1.0])
    _step(optimizer, theta, d1, weight=4.0, lr=0.1)
    torch.testing.assert_close(theta, 0.1 * d1)
    _step(optimizer, theta, d2, weight=2.0, lr=0.1)
    velocity = 0.5 * d1 + d2
    torch.testing.assert_close(theta, 0.1 * d1 + 0.1 * velocity)
    torch.testing.assert_close(optimizer.state["cluster0.0.velocity"].float(), velocity)


def test_adam_follows_reddi_et_al_without_bias_correction():
    config = ServerOptimizerConfig("adam", betas=(0.9, 0.99), tau=1e-3)
    optimizer = ServerOptimizer(config)
    theta = torch.ones(2)
    delta = torch.tensor([0.2, -0.01])
    _step(optimizer, theta, delta, weight=1.0, lr=0.05)
    m = 0.1 * delta.double()
    v = 0.99 * 1e-6 + 0.01 * delta.double() ** 2
    torch.testing.assert_close(theta, (1 + 0.05 * m / (v.sqrt() + 1e-3)).float())


def test_a_cluster_without_weight_keeps_its_model_and_its_state():
    optimizer = ServerOptimizer(ServerOptimizerConfig("momentum"))
    theta = torch.zeros(2)
    _step(optimizer, theta, torch.ones(2), weight=1.0, lr=1.0)
    before, velocity = theta.clone(), optimizer.state["cluster0.0.velocity"].clone()
    assert not optimizer.step("cluster0", [theta], [torch.zeros(2, dtype=torch.float64)], 0.0, 1.0)
    assert torch.equal(theta, before) and torch.equal(optimizer.state["cluster0.0.velocity"], velocity)


def _fit(executor: str = "loop", rounds: int = 3, server_optimizer: str = "momentum", **options):
    strategy = lf.FedRCStrategy(
        num_clusters=2,
        local_steps=2,
        clients_per_round=4,
        executor=executor,
        server_optimizer=server_optimizer,
        **({"server_lr": 0.5} if server_optimizer != "none" else {}),
    )
    trainer = make_trainer(strategy, max_epochs=rounds, **options)
    trainer.fit(MLPClassifier(lr=0.05), datamodule=DigitsFederated(num_clients=6, concepts=2, seed=0))
    return trainer


def _weights(trainer) -> list[torch.Tensor]:
    return [v.clone() for v in trainer.lightning_module.state_dict().values()]


def test_server_momentum_changes_training_and_keeps_state_per_cluster():
    plain, momentum = _fit(server_optimizer="none"), _fit()
    assert plain.lightning_module.server_optimizer is None
    state = momentum.lightning_module.server_optimizer.state
    tensors = len(momentum.lightning_module.cluster_tensors(0))
    assert sorted(state) == sorted(f"cluster{k}.{i}.velocity" for k in range(2) for i in range(tensors))
    assert any(not torch.equal(a, b) for a, b in zip(_weights(plain), _weights(momentum), strict=True))


def test_both_executors_take_the_same_server_steps():
    loop, vectorized = _fit("loop", server_optimizer="adam"), _fit("vectorized", server_optimizer="adam")
    assert vectorized.lightning_module.executor == "vectorized"
    for a, b in zip(_weights(loop), _weights(vectorized), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_server_state_resumes_exactly_from_a_round_checkpoint(tmp_path):
    straight = _fit(rounds=4)
    saver = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    _fit(rounds=2, enable_checkpointing=True, callbacks=[saver])
    (checkpoint,) = tmp_path.glob("epoch=1-*.ckpt")
    assert torch.load(checkpoint, weights_only=False)["fedcluster_server_optimizer"]["kind"] == "momentum"
    strategy = lf.FedRCStrategy(
        num_clusters=2,
        local_steps=2,
        clients_per_round=4,
        executor="loop",
        server_optimizer="momentum",
        server_lr=0.5,
    )
    resumed = make_trainer(strategy, max_epochs=4)
    resumed.fit(
        MLPClassifier(lr=0.05),
        datamodule=DigitsFederated(num_clients=6, concepts=2, seed=0),
        ckpt_path=checkpoint,
    )
    for a, b in zip(_weights(straight), _weights(resumed), strict=True):
        assert torch.equal(a, b)
    other = make_trainer(lf.FedRCStrategy(num_clusters=2, local_steps=2, clients_per_round=4), max_epochs=4)
    with pytest.raises(ValueError, match="server_optimizer='momentum'"):
        other.fit(
            MLPClassifier(lr=0.05),
            datamodule=DigitsFederated(num_clients=6, concepts=2, seed=0),
            ckpt_path=checkpoint,
        )
