"""engine/round.py: a round's report is generated from declarations (scope, shape, reduction): the
buffer every process fills, a node's reply and the server's merge of it, and the store update; a
per-cluster entry stays one per cluster when K equals the number of clients M."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_fedcluster.algorithms import IFCA, Scope, StateEntry
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine import server_step
from lightning_fedcluster.engine.round import RoundState

K = M = 3  # a per-cluster [K] entry looks like a per-client [M] one: only its declaration tells


class TallyIFCA(IFCA):
    """IFCA whose clients also report, per cluster, their ω (summed over the round), their own
    last round, and their size (averaged over the round); they read a per-cluster value the
    server owns."""

    def state_entries(self) -> tuple[StateEntry, ...]:
        return (
            StateEntry("mass", Scope.CLUSTER, reported=True, reduction="sum"),
            StateEntry("last_round", Scope.CLIENT, initial=-1.0, reported=True),
            StateEntry("mean_size", Scope.SCALAR, reported=True, reduction="mean"),
            StateEntry("bias", Scope.CLUSTER, initial=0.5),
        )

    def e_step(self, losses, labels, context, log_label_stats):
        report = super().e_step(losses, labels, context, log_label_stats)
        bias = context.extra["bias"]
        if tuple(bias.shape) != (self.num_clusters,):
            raise AssertionError(f"the per-cluster entry reached the client as {tuple(bias.shape)}")
        context.extra["mass"] = report.omega.clone()
        context.extra["last_round"] = torch.tensor(float(context.round_index))
        context.extra["mean_size"] = torch.tensor(float(context.num_samples))
        return report


def _round(rule: TallyIFCA, state: ClientState, clients: list[int], sizes: list[int]) -> RoundState:
    snapshot = ([[torch.zeros(2)] for _ in range(K)], [])
    tensor = torch.tensor
    return RoundState(3, tensor(clients), tensor(sizes), snapshot, rule, state, 2, 0, torch.device("cpu"))


def _report(round_state: RoundState, slot: int, client: int, omega: list[float], size: int) -> None:
    """A client's turn as an executor records it (its context after the rule's E-step)."""
    extra = {
        "mass": torch.tensor(omega, dtype=torch.float64),
        "last_round": torch.tensor(3.0),
        "mean_size": torch.tensor(float(size)),
    }
    work = SimpleNamespace(slot=slot, context=SimpleNamespace(extra=extra))
    report = SimpleNamespace(omega=torch.tensor(omega, dtype=torch.float64), label_sums=torch.zeros(2, K))
    round_state.record(work, report)


def _store(rule: TallyIFCA) -> ClientState:
    return ClientState.initial(M, 2, K, rule.state_entries(), num_samples=30)


def test_the_declared_report_assembles_over_processes_and_nodes_alike():
    rule = TallyIFCA(K)
    clients, sizes = [0, 2], [10, 14]
    omegas = [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    # Two processes, one client each: their buffers summed by one all-reduce.
    first, second = (_round(rule, _store(rule), clients, sizes) for _ in range(2))
    _report(first, 0, 0, omegas[0], 10)
    _report(second, 1, 2, omegas[1], 14)
    sent: list[torch.Tensor] = []
    second.reduce(lambda flat: sent.append(flat.clone()) or flat)  # what the other process sends
    first.reduce(lambda flat: flat + sent[0])
    # Two nodes, one client each: their replies merged by the server.
    merged = _round(rule, _store(rule), clients, sizes)
    for slot, client in enumerate(clients):
        node = _round(rule, _store(rule), [client], [sizes[slot]])
        _report(node, 0, client, omegas[slot], sizes[slot])
        reply = node.reply(torch.tensor([client]))
        assert reply["clients"].tolist() == [client] and reply["rejected"].tolist() == []
        assert "extra.mass" in reply and tuple(reply["extra.mass"].shape) == (K,)
        merged.merge(reply, {c: s for s, c in enumerate(clients)})
    assert torch.equal(merged.report.flat, first.report.flat)
    state = _store(rule)
    server_step.record_round(rule, state, merged, torch.tensor([0, 10, 20, 30]))
    assert state.extra["mass"].tolist() == [0.0, 1.0, 1.0]  # the round's ω, summed per cluster
    assert state.extra["last_round"].tolist() == [3.0, -1.0, 3.0]  # client 1 did not report
    assert float(state.extra["mean_size"]) == 12.0  # (10 + 14) / 2
    assert state.extra["bias"].tolist() == [0.5, 0.5, 0.5]  # the server's own, untouched


def test_a_shared_entry_reported_by_clients_must_say_how_reports_combine():
    with pytest.raises(ValueError, match="reduction='sum' or 'mean'"):
        StateEntry("mass", Scope.CLUSTER, reported=True)
    with pytest.raises(ValueError, match="reduction is 'replace'"):
        StateEntry("size", Scope.CLIENT, reported=True, reduction="sum")
    with pytest.raises(ValueError, match="reduction must be one of"):
        StateEntry("size", Scope.SCALAR, reported=True, reduction="max")


def _fit(executor: str, rounds: int = 2):
    from lightning_fedcluster import FederatedStrategy
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    strategy = FederatedStrategy(algorithm=TallyIFCA(K), local_steps=2, executor=executor)
    trainer = make_trainer(strategy, max_epochs=rounds)
    datamodule = DigitsFederated(num_clients=M, concepts=1, seed=0)
    trainer.fit(MLPClassifier(), datamodule=datamodule)
    return trainer.lightning_module, datamodule


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_every_scope_reaches_the_store_when_k_equals_m(executor):
    module, datamodule = _fit(executor)
    assert module.executor == executor
    state = module.client_state
    assert state.extra["last_round"].tolist() == [1.0] * M  # every client took part in round 1
    assert torch.equal(state.extra["mass"], state.omega.sum(0))  # one value per cluster, not client
    assert float(state.extra["mean_size"]) == float(datamodule.train_sizes.double().mean())
    assert state.extra["bias"].tolist() == [0.5] * K
