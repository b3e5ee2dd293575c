"""reseed_threshold: a dead FedRC cluster restarts as a split of the largest one; off by default,
deterministic, and exact across checkpoints."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.reseed import SPLIT_SHARE, reseed_split
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.weights import assert_same_fit


def _omega() -> torch.Tensor:
    """Six seen clients: four in cluster 0, two in cluster 1, none in cluster 2 (dead)."""
    rows = [[0.97, 0.02, 0.01]] * 4 + [[0.05, 0.949, 0.001]] * 2
    return torch.tensor(rows, dtype=torch.float64)


def test_the_dead_cluster_takes_a_seeded_half_of_the_largest_clusters_clients():
    omega, sizes, seen, active = (
        _omega(),
        torch.full((6,), 10),
        torch.ones(6, dtype=torch.bool),
        torch.ones(3, dtype=torch.bool),
    )
    split = reseed_split(omega, sizes, seen, active, 0.05, seed=3, round_index=7)
    assert (split.target, split.source) == (2, 0)
    assert sorted(split.clients.tolist()) == [0, 1, 2, 3]
    assert sorted(split.to_target.tolist()) == pytest.approx([1 - SPLIT_SHARE] * 2 + [SPLIT_SHARE] * 2)
    again = reseed_split(omega, sizes, seen, active, 0.05, seed=3, round_index=7)
    assert torch.equal(split.clients, again.clients) and torch.equal(split.to_target, again.to_target)
    assert reseed_split(omega, sizes, seen, active, 0.005, seed=3, round_index=7) is None  # nobody dead


def test_a_split_moves_omega_and_label_mass_and_restarts_the_targets_optimizer_state():
    state = ClientState.initial(6, 2, 3)
    state.omega.copy_(_omega())
    state.label_sums[:, 0, :] = state.omega * 10
    state.optimizer_started[:] = True
    split = reseed_split(
        state.omega, torch.full((6,), 10), torch.ones(6, dtype=torch.bool), state.active, 0.05, 0, 0
    )
    before = state.omega.clone()
    state.split_cluster(split.source, split.target, split.clients, split.to_target)
    torch.testing.assert_close(state.omega.sum(1), before.sum(1))
    moved = split.clients[split.to_target == SPLIT_SHARE]
    torch.testing.assert_close(state.omega[moved, 2], before[moved, 2] + SPLIT_SHARE * before[moved, 0])
    torch.testing.assert_close(state.label_sums[:, 0, :], state.omega * 10)
    assert not bool(state.optimizer_started[:, 2].any()) and bool(state.optimizer_started[:, :2].all())


def _fit(rounds: int, reseed: float | None = 0.34, server_optimizer: str = "none", **trainer_options):
    options = {} if reseed is None else {"reseed_threshold": reseed}
    strategy = lf.FedRCStrategy(
        3,
        local_steps=2,
        clients_per_round=4,
        executor="loop",
        server_optimizer=server_optimizer,
        config=FedRC.Config(**options),
    )
    trainer = make_trainer(strategy, max_epochs=rounds, **trainer_options)
    trainer.fit(MLPClassifier(lr=0.05), datamodule=DigitsFederated(num_clients=6, concepts=2, seed=0))
    return trainer


def _identical_clusters(trainer) -> list[tuple[int, int]]:
    module = trainer.lightning_module
    tensors = [module.cluster_tensors(k) for k in range(3)]
    return [
        (a, b)
        for a in range(3)
        for b in range(a + 1, 3)
        if all(torch.equal(x, y) for x, y in zip(tensors[a], tensors[b], strict=True))
    ]


def test_a_reseeded_cluster_restarts_from_the_largest_ones_model_and_is_off_by_default():
    # With a threshold above 1/K some cluster is always below it: the split happens after round 0.
    reseeded, plain = _fit(1), _fit(1, reseed=None)
    assert len(_identical_clusters(reseeded)) == 1
    assert _identical_clusters(plain) == []
    assert plain.strategy.algorithm.config.reseed_threshold is None


def test_a_reseeded_cluster_restarts_its_server_optimizer_state():
    """With server momentum, the re-seeded cluster is a copy of the largest one's model and starts
    without velocity (its old direction belonged to the dead model); the others keep theirs."""
    trainer = _fit(1, server_optimizer="momentum")
    ((a, b),) = _identical_clusters(trainer)  # the re-seeded cluster and the one it copies
    groups = {key.split(".", 1)[0] for key in trainer.lightning_module.server_optimizer.state}
    (other,) = {0, 1, 2} - {a, b}
    assert f"cluster{other}" in groups
    assert len({f"cluster{a}", f"cluster{b}"} & groups) == 1  # the copied one kept its velocity


def test_reseeding_resumes_exactly_from_a_round_checkpoint(tmp_path):
    straight = _fit(4)
    _fit(2, enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)])
    (checkpoint,) = tmp_path.glob("epoch=1-*.ckpt")
    strategy = lf.FedRCStrategy(
        3, local_steps=2, clients_per_round=4, executor="loop", config=FedRC.Config(reseed_threshold=0.34),
    )
    resumed = make_trainer(strategy, max_epochs=4)
    resumed.fit(
        MLPClassifier(lr=0.05),
        datamodule=DigitsFederated(num_clients=6, concepts=2, seed=0),
        ckpt_path=checkpoint,
    )
    assert_same_fit(straight, resumed)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reseed_threshold": 1.5}, "reseed_threshold must be in"),
        ({"reseed_threshold": 0.05, "removal_threshold": 0.05}, "removal_threshold"),
        ({"reseed_threshold": 0.05, "adam_gamma": True}, "adam_gamma"),
    ],
)
def test_bad_reseed_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        lf.FedRCStrategy(3, config=FedRC.Config(**options))
