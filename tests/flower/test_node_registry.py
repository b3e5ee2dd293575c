"""Nodes that leave and come back: a node lost in a round is described again when the grid
lists it, takes its partition back from the next round with its clients' stores restored from
the server's, and the run ends with the weights of a run that dropped the same client-rounds; a
new node replaces a lost one; a node claiming a partition that a live node holds is refused by
name while the run goes on."""

from __future__ import annotations

import logging

import torch
from flwr.app import Context, RecordDict

import lightning_fedcluster as lf
from lightning_fedcluster.flower import FlowerApps
from tests.flower import workload
from tests.flower.local_grid import LocalGrid, partitions, run_local
from tests.flower.test_aggregation import nan_update, poisoning

NODE_B = 101  # partition 1 of 2: clients 3, 4, 5
ROUNDS = 4


def strategy():
    return lf.FedRCStrategy(3, clients_per_round=5, local_steps=2, executor="loop")


def apps() -> FlowerApps:
    return FlowerApps(strategy, workload.make_module, workload.make_datamodule, num_rounds=ROUNDS)


def away_in_round_one(node, message):
    """Node B's reply to round 1 never comes (a killed or cut-off node); from round 2 it answers."""
    train = message.metadata.message_type == "train"
    return "silent" if train and node == NODE_B and int(message.metadata.group_id) == 1 else None


def dropped_in_round_one():
    """The reference: node B's round-1 reply is rejected (NaN), so its clients are left out of
    round 1 only, and B stays in the run."""
    return run_local(apps(), partitions(2), replies=poisoning(nan_update, first_round=1, last_round=1))[0]


def assert_same(a, b) -> None:
    for key, tensor in a.state_dict().items():
        assert torch.equal(b.state_dict()[key], tensor), key
    for key, tensor in a.client_state.state_dict().items():
        assert torch.equal(b.client_state.state_dict()[key], tensor), key


def test_a_node_that_comes_back_trains_again_from_the_next_round(task_identity, caplog):
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        module, _ = run_local(apps(), partitions(2), away_in_round_one)
    assert "round 2: node 101 (partition 1) failed (no reply" in caplog.text
    assert (
        "round 3: node 101 (partition 1) is back; its clients [3, 4, 5] train again from this round"
        in caplog.text
    )
    assert module.round_metrics["train/clients"] == 5, "node B's clients are in the last round"
    assert_same(dropped_in_round_one(), module)


class GrowingGrid(LocalGrid):
    """A grid on which node B goes away in round 1 and a new node (a restarted SuperNode with a new
    id) holding B's partition shows up from round 2 on."""

    def __init__(self, client_app, node_configs) -> None:
        super().__init__(client_app, node_configs, self.fault)
        self.listings = 0

    def fault(self, node, message):
        if message.metadata.message_type == "train" and int(message.metadata.group_id) == 1:
            if node == NODE_B:
                return "silent"
        return None

    def get_node_ids(self):
        self.listings += 1
        if 102 not in self.contexts and self.listings >= 4:  # after the first rounds' listings
            self.contexts[102] = Context(run_id=self.run_id, node_id=102, node_config=partitions(2)[1],
                                         state=RecordDict(), run_config={})  # fmt: skip
            self.contexts.pop(NODE_B)
        return list(self.contexts)


def test_a_new_node_takes_over_the_partition_of_a_lost_one(task_identity, caplog):
    app = apps()
    grid = GrowingGrid(app.client_app(), partitions(2))
    context = Context(run_id=grid.run_id, node_id=0, node_config={}, state=RecordDict(), run_config={})
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        module = app.run_server(grid, context)
    assert "node 102 (partition 1) is back; its clients [3, 4, 5] train again" in caplog.text
    assert_same(dropped_in_round_one(), module)


def test_a_node_claiming_a_partition_another_node_holds_is_refused_and_the_run_goes_on(task_identity, caplog):
    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        crowded, _ = run_local(apps(), [*partitions(2), partitions(2)[1]])
    assert caplog.text.count("node 102 claims partition 1, which node 101 holds: node 102 is not used") == 1
    assert_same(run_local(apps(), partitions(2))[0], crowded)


def test_what_nodes_get_of_the_servers_store_follows_the_declarations_when_k_equals_m():
    """A per-cluster [K] entry goes whole and a per-client one as the nodes' clients' rows, though
    with K == M both look alike; a client-reported per-client entry is the nodes' own (sent only
    once an action rewrote it), ω and label sums too."""
    from lightning_fedcluster.algorithms import Scope, StateEntry
    from lightning_fedcluster.algorithms.client_state import ClientState
    from lightning_fedcluster.flower.node_registry import sent_entries, store_rows

    entries = (
        StateEntry("bias", Scope.CLUSTER, initial=0.5),
        StateEntry("importance", Scope.CLIENT, (3,), initial=1 / 3),
        StateEntry("last_round", Scope.CLIENT, reported=True),
        StateEntry("gamma", Scope.SAMPLE, (3,), reported=True, mixture=True),
    )
    state = ClientState.initial(3, 2, 3, entries, num_samples=6)
    sent = sent_entries(state, [0, 2], set())
    assert sorted(sent) == ["store.bias", "store.importance"]
    assert tuple(sent["store.bias"].shape) == (3,) and tuple(sent["store.importance"].shape) == (2, 3)
    rewritten = sent_entries(state, [1], {"omega", "last_round"})
    assert tuple(rewritten["store.omega"].shape) == (1, 3) and tuple(rewritten["store.last_round"].shape) == (
        1,
    )
    rows = store_rows(state, [1])
    assert tuple(rows["extra.bias"].shape) == (3,) and tuple(rows["extra.last_round"].shape) == (1,)
    assert "extra.gamma" not in rows  # per-sample state stays on the nodes
