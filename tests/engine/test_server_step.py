"""engine/server_step.py: the server's pieces of a round on a report buffer written by hand:
``record_round`` stores each reporting client's ω, label sums, per-client and per-sample entries at
its own offsets, per-cluster and run-wide entries by their reduction (K == M == the round's size,
so a [K] entry cannot pass for the clients' rows), optimizer state and personal models; a client
that did not report leaves the store as it was. ``round_outcome`` and ``round_metrics`` read the
same buffer; a round where nobody reported changes nothing and divides by nothing."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.protocols import PersonalMixing, PersonalModels
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.engine.server_step import record_round, round_metrics, round_outcome
from lightning_fedcluster.engine.task import Task

K = M = 3
TRAIN_OFFSETS = torch.tensor([0, 2, 6, 9])  # clients 0, 1, 2 own 2, 4 and 3 training rows
CLIENTS, SIZES = [2, 1, 0], [3, 4, 2]  # the round's slots 0, 1, 2; slot 1 (client 1) is rejected
F64 = torch.float64


class Reporting(Algorithm):
    """Clients report an entry of every scope; the server owns one more (``bias``)."""

    def state_entries(self) -> tuple[StateEntry, ...]:
        return (
            StateEntry("gamma", Scope.SAMPLE, (K,), reported=True),
            StateEntry("last", Scope.CLIENT, initial=-1.0, reported=True, dtype=torch.float32),
            StateEntry("mass", Scope.CLUSTER, reported=True, reduction="sum"),
            StateEntry("mean_size", Scope.SCALAR, (2,), reported=True, reduction="mean"),
            StateEntry("bias", Scope.CLUSTER, initial=0.5),
        )


def _store(rule: Algorithm) -> ClientState:
    return ClientState.initial(M, 2, K, rule.state_entries(), num_samples=9)


def _round(rule: Algorithm, state: ClientState, vector_size: int = 0, **options) -> RoundState:
    """Round 7 of ``CLIENTS`` with 2 classes and ``vector_size`` floats per client's vector."""
    snapshot = ([[torch.zeros(2)] for _ in range(K)], [])
    clients, sizes = torch.tensor(CLIENTS), torch.tensor(SIZES)
    return RoundState(
        7, clients, sizes, snapshot, rule, state, 2, vector_size, torch.device("cpu"), **options
    )


def _fill(round_state: RoundState, reported: tuple[int, ...] = (0, 2)) -> None:
    """The buffer as the round's clients and processes leave it: every slot's rows written (the
    rejected slot's too, which must not land), ``reported`` marked, the others rejected."""
    report = round_state.report
    report["omega"][:] = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    report["label_sums"][:] = torch.arange(18, dtype=F64).view(3, 2, K)
    for slot in range(3):
        report["reported" if slot in reported else "rejected"][slot] = 1.0
    if "extra.gamma" in report:
        report["extra.gamma"][:] = 100 + torch.arange(27, dtype=F64).view(9, K)  # slot rows 0:3, 3:7, 7:9
        report["extra.last"][:] = torch.tensor([7.0, 8.0, 9.0])
        report["extra.mass"][:] = torch.tensor([3.0, 0.5, 1.0])  # the reporting clients' sum
        report["extra.mean_size"][:] = torch.tensor([5.0, 8.0])  # summed over the 2 reporting clients


def test_record_round_stores_each_reporting_clients_report_at_its_offsets():
    rule = Reporting(K)
    state = _store(rule)
    round_state = _round(rule, state)
    _fill(round_state)
    record_round(rule, state, round_state, TRAIN_OFFSETS)
    # ω and label sums by client id: slot 0 is client 2, slot 2 client 0; client 1 keeps 1/K.
    assert state.omega.tolist() == [[1.0, 0.0, 0.0], [1 / 3] * 3, [0.0, 0.0, 1.0]]
    assert state.label_sums[2].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert state.label_sums[0].tolist() == [[12.0, 13.0, 14.0], [15.0, 16.0, 17.0]]
    assert not state.label_sums[1].any()
    assert state.seen.tolist() == [True, False, True]
    # Per sample: slot 0's rows 0:3 are client 2's training rows 6:9, slot 2's 7:9 client 0's 0:2.
    gamma = 100 + torch.arange(27, dtype=F64).view(9, K)
    assert torch.equal(state.extra["gamma"][6:9], gamma[0:3])
    assert torch.equal(state.extra["gamma"][0:2], gamma[7:9])
    assert not state.extra["gamma"][2:6].any()  # client 1's rows: untouched
    # Per client, in the entry's own dtype; client 1 keeps its initial -1.
    assert state.extra["last"].dtype == torch.float32 and state.extra["last"].tolist() == [9.0, -1.0, 7.0]
    # Per cluster (sum) and for the run (mean over the 2 reporting clients), not indexed by client.
    assert state.extra["mass"].tolist() == [3.0, 0.5, 1.0]
    assert state.extra["mean_size"].tolist() == [2.5, 4.0]
    assert state.extra["bias"].tolist() == [0.5, 0.5, 0.5]  # the server's own


def test_record_round_leaves_the_store_alone_when_nobody_reported():
    rule = Reporting(K)
    state = _store(rule)
    before = state.state_dict()
    round_state = _round(rule, state)
    _fill(round_state, reported=())
    record_round(rule, state, round_state, TRAIN_OFFSETS)
    after = state.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)  # no mean over 0 clients


def test_record_round_stores_the_summed_optimizer_state_of_reporting_clients():
    """Several processes (``optimizer_in_store=False``): each client's flat state and its [K]
    started flags travel in the round's buffer and land in the store by client id."""
    rule = Algorithm(K)
    state = ClientState.initial(M, 2, K)
    round_state = _round(rule, state, optimizer_size=2)
    _fill(round_state)
    round_state.optimizer["vectors"][:] = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    round_state.report["optimizer_started"][:] = torch.tensor(
        [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    )
    record_round(rule, state, round_state, TRAIN_OFFSETS)
    assert sorted(state.optimizer) == [0, 2]
    assert state.optimizer[2].tolist() == [1.0, 2.0] and state.optimizer[0].tolist() == [5.0, 6.0]
    assert state.optimizer_started.tolist() == [[True] * 3, [False] * 3, [True, False, True]]


def test_record_round_leaves_optimizer_state_already_in_the_store_alone():
    """One process (``optimizer_in_store=True``): the executor stored it as each client finished."""
    rule = Algorithm(K)
    state = ClientState.initial(M, 2, K)
    round_state = _round(rule, state, optimizer_size=2, optimizer_in_store=True)
    assert round_state.optimizer is None
    _fill(round_state)
    record_round(rule, state, round_state, TRAIN_OFFSETS)
    assert state.optimizer == {} and not state.optimizer_started.any()


class Personal(Algorithm, PersonalModels):
    """Clients keep personal models; the server only stores them."""


class Gossip(Algorithm, PersonalMixing):
    """Clients keep personal models that the server mixes after the round."""

    def __init__(self, num_clusters: int) -> None:
        super().__init__(num_clusters)
        self.mixed: list[tuple[dict[int, list[float]], int]] = []

    def mix_personal(self, personal: dict[int, torch.Tensor], round_index: int) -> None:
        self.mixed.append(({c: v.tolist() for c, v in personal.items()}, round_index))
        for vector in personal.values():
            vector.mul_(2.0)


def _vector_round(rule: Algorithm, state: ClientState) -> RoundState:
    round_state = _round(rule, state, vector_size=2)
    round_state.vectors["vectors"][:] = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    _fill(round_state)
    return round_state


def test_record_round_keeps_the_personal_models_of_reporting_clients():
    rule = Personal(K)
    state = ClientState.initial(M, 2, K)
    state.personal[1] = torch.tensor([9.0, 9.0])  # client 1, rejected this round, keeps its own
    round_state = _vector_round(rule, state)
    record_round(rule, state, round_state, TRAIN_OFFSETS)
    assert {c: v.tolist() for c, v in state.personal.items()} == {0: [5.0, 6.0], 1: [9.0, 9.0], 2: [1.0, 2.0]}
    round_state.vectors["vectors"].zero_()
    assert state.personal[0].tolist() == [5.0, 6.0]  # a copy, not a view of the round's buffer
    # A rule without personal models that reads vectors (CFL's updates) stores none.
    plain = ClientState.initial(M, 2, K)
    record_round(Algorithm(K), plain, _vector_round(Algorithm(K), plain), TRAIN_OFFSETS)
    assert plain.personal == {}


def test_record_round_mixes_the_personal_models_once_they_are_stored():
    rule = Gossip(K)
    state = ClientState.initial(M, 2, K)
    record_round(rule, state, _vector_round(rule, state), TRAIN_OFFSETS)
    assert rule.mixed == [({2: [1.0, 2.0], 0: [5.0, 6.0]}, 7)]
    assert {c: v.tolist() for c, v in state.personal.items()} == {2: [2.0, 4.0], 0: [10.0, 12.0]}


def test_round_outcome_holds_the_reporting_clients_only():
    rule = Algorithm(K)
    state = ClientState.initial(M, 2, K)
    train_sizes = torch.tensor([2, 4, 3])
    round_state = _vector_round(rule, state)
    outcome = round_outcome(round_state, train_sizes)
    assert outcome.round_index == 7
    assert outcome.clients.tolist() == [2, 0] and outcome.sizes.tolist() == [3, 2]
    assert outcome.omega.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    assert outcome.vectors.tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert outcome.train_sizes is train_sizes  # every client's, reporting or not
    no_vectors = _round(rule, state)
    _fill(no_vectors, reported=())
    empty = round_outcome(no_vectors, train_sizes)
    assert empty.vectors is None and empty.clients.tolist() == [] and tuple(empty.omega.shape) == (0, K)


@pytest.mark.parametrize(
    ("task", "second"), [(Task.CLASSIFICATION, "train/acc"), (Task.REGRESSION, "train/mse")]
)
def test_round_metrics_are_the_summed_metrics_per_sample(task, second):
    rule = Algorithm(K)
    state = ClientState.initial(M, 2, K)
    state.active = torch.tensor([True, False, True])
    round_state = _round(rule, state)
    _fill(round_state)
    round_state.add_metrics(torch.tensor([6.0, 3.0, 4.0], dtype=F64))  # NLL, correct, samples
    assert round_metrics(round_state, state, task) == {
        "train/loss": 1.5, second: 0.75, "train/clients": 2.0, "clusters/active": 2.0,
    }  # fmt: skip


def test_round_metrics_of_a_round_without_samples_are_zero_not_nan():
    rule = Algorithm(K)
    state = ClientState.initial(M, 2, K)
    round_state = _round(rule, state)
    _fill(round_state, reported=())
    assert round_metrics(round_state, state, Task.CLASSIFICATION) == {
        "train/loss": 0.0, "train/acc": 0.0, "train/clients": 0.0, "clusters/active": 3.0,
    }  # fmt: skip
