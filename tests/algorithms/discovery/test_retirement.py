"""algorithms/discovery/retirement.py: retiring the clusters no client owns, against hand computations (who
owns what, ties, dead and unseen clients, when it acts), its option checks, and real fits: it
retires, keeps loop = vectorised, and resumes bit-identically from a checkpoint before it acts."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import Note, RemoveClusters
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.retirement import (
    ClusterRetirement,
    cluster_owners,
    unowned_clusters,
)
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.server_view import RoundOutcome, ServerView
from tests.helpers.algorithms import view_at
from tests.helpers.weights import assert_same_fit

F64 = torch.float64


def _state() -> ClientState:
    """Five clients, four clusters; cluster 3 is dead. Client 0 owns 1, client 1 owns 0 (its 0.5 on
    dead cluster 3 does not count), client 2 is tied between 0 and 1, client 3 was never seen (its
    ω points to 2), client 4 owns 1."""
    state = ClientState.initial(5, 2, 4)
    state.active[3] = False
    state.seen[:] = torch.tensor([True, True, True, False, True])
    state.omega.copy_(
        torch.tensor(
            [
                [0.2, 0.7, 0.1, 0.0],
                [0.3, 0.1, 0.1, 0.5],
                [0.4, 0.4, 0.2, 0.0],
                [0.1, 0.1, 0.8, 0.0],
                [0.1, 0.6, 0.3, 0.0],
            ],
            dtype=F64,
        )
    )
    return state


def test_a_seen_client_owns_the_alive_cluster_of_its_strictly_largest_omega():
    state = _state()
    owners = cluster_owners(state.omega, state.seen, state.active)
    assert owners.tolist() == [1, 0, -1, -1, 1]


def test_the_alive_clusters_no_seen_client_owns_are_unowned():
    state = _state()
    # Cluster 2 is only the largest ω of the unseen client 3; cluster 3 is already dead.
    assert unowned_clusters(state.omega, state.seen, state.active).tolist() == [False, False, True, False]


def test_nothing_is_unowned_when_no_seen_client_owns_a_cluster():
    state = ClientState.initial(3, 2, 3)  # uniform ω: every client tied
    state.seen[:] = True
    assert not bool(unowned_clusters(state.omega, state.seen, state.active).any())
    state.seen[:] = False
    state.omega[0] = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    assert not bool(unowned_clusters(state.omega, state.seen, state.active).any())


def test_one_alive_cluster_is_owned_by_every_seen_client():
    state = _state()
    state.active[:] = torch.tensor([False, True, False, False])
    assert cluster_owners(state.omega, state.seen, state.active).tolist() == [1, 1, 1, -1, 1]
    assert not bool(unowned_clusters(state.omega, state.seen, state.active).any())


def test_retirement_acts_from_its_round_on_and_the_store_renormalises_omega():
    state = _state()
    assert ClusterRetirement(after=6).actions(view_at(state, 5)) == []
    remove, note = ClusterRetirement(after=5).actions(view_at(state, 5))
    assert isinstance(remove, RemoveClusters) and remove.mask.tolist() == [False, False, True, False]
    assert isinstance(note, Note)
    assert note.text == "round 6: retired cluster(s) [2] (no client's largest ω); 2 remain"
    remove.apply(_Target(state))
    assert state.active.tolist() == [True, True, False, False]
    # Client 0: (0.2, 0.7) / 0.9; client 3 (unseen): (0.1, 0.1) / 0.2.
    assert_close(state.omega[0], torch.tensor([2 / 9, 7 / 9, 0.0, 0.0], dtype=F64))
    assert_close(state.omega[3], torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=F64))
    # Nothing left to retire: no action at all.
    assert ClusterRetirement(after=5).actions(view_at(state, 6)) == []


class _Target:
    def __init__(self, state: ClientState) -> None:
        self.client_state, self.global_clusters = state, []

    def model_replaced(self, cluster: int) -> None:  # pragma: no cover - removal replaces nothing
        raise AssertionError(cluster)

    def say(self, text: str) -> None:  # pragma: no cover
        raise AssertionError(text)


def test_fedrc_after_round_returns_the_retirement_when_it_is_due():
    state = _state()
    rule = FedRC(4, retire_after=0)

    sizes = torch.tensor([10] * 5)
    outcome = RoundOutcome(0, torch.arange(5), state.omega, sizes, sizes)
    remove, _ = rule.after_round(ServerView(outcome, state, []))
    assert remove.mask.tolist() == [False, False, True, False]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retire_after": -1}, "retire_after must be a number of rounds >= 0, got -1"),
        ({"retire_after": True}, "retire_after must be a number of rounds >= 0, got True"),
        ({"retire_after": "5"}, "retire_after must be a number of rounds >= 0, got '5'"),
        ({"retire_after": 2, "reseed_threshold": 0.05}, "cannot be combined with reseed_threshold"),
        ({"retire_after": 4, "group_round": 5}, "retire_after=4 must be >= group_round=5"),
    ],
)
def test_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        FedRC(4, **options)
    assert FedRC(4, retire_after=5, group_round=5).config.retirement == ClusterRetirement(5)


def _fit(rounds: int, executor: str = "loop", **trainer_options):
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        6, clients_per_round=6, local_steps=2, config=FedRC.Config(retire_after=2), executor=executor,
    )
    trainer = make_trainer(strategy, max_epochs=rounds, **trainer_options)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0))
    return trainer


def test_a_fit_from_k6_keeps_exactly_the_owned_clusters_on_both_executors():
    loop, vectorized = (_fit(4, executor).lightning_module for executor in ("loop", "vectorized"))
    state = loop.client_state
    owners = cluster_owners(state.omega, state.seen, state.active)
    owned = torch.zeros(6, dtype=torch.bool)
    owned[owners[owners >= 0]] = True
    assert 1 <= int(state.active.sum()) < 6
    assert torch.equal(state.active, owned)  # every cluster held is some client's, and no other
    assert bool((state.omega[:, ~state.active] == 0).all())
    assert_close(state.omega.sum(1), torch.ones(9, dtype=F64))
    assert torch.equal(vectorized.client_state.active, state.active)
    for name, tensor in loop.state_dict().items():
        assert_close(vectorized.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_retirement_resumes_exactly_from_a_checkpoint_written_before_it_acted(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    straight = _fit(5)
    assert int(straight.lightning_module.client_state.active.sum()) < 6
    _fit(2, enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)])
    (checkpoint,) = tmp_path.glob("epoch=1-*.ckpt")  # after round index 1: nothing retired yet
    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        6, clients_per_round=6, local_steps=2, config=FedRC.Config(retire_after=2), executor="loop",
    )
    resumed = make_trainer(strategy, max_epochs=5)
    datamodule = DigitsFederated(num_clients=9, concepts=3, seed=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=datamodule, ckpt_path=checkpoint)
    assert_same_fit(straight, resumed)
