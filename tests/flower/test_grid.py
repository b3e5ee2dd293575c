"""flower/grid.py: the nodes of a Flower grid as the round's executor. The server hands every
round to ``RoundDriver.run`` with a ``GridExecutor``; the round is whole on the server (no
reduce), a node that stops answering is dropped from the rounds it misses (recorded per round)
and its clients come back to the schedule's sums from the nodes that answer."""

from __future__ import annotations

import logging

from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.flower.grid import GridExecutor
from lightning_fedcluster.flower.node import node_clients
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local

NODE_B = 101


def silent_in_round_one(node, message):
    """Node B does not answer the train message of round 1 (0-based) and answers everything else."""
    train = message.metadata.message_type == "train"
    return "silent" if train and node == NODE_B and message.metadata.group_id == "1" else None


def test_the_grid_is_an_executor_whose_rounds_are_whole_on_the_server():
    assert GridExecutor.reduce is None  # nothing to sum over processes: the replies make the round
    for hook in ("train", "estimate"):
        assert callable(getattr(GridExecutor, hook))


def test_a_silent_node_is_dropped_from_the_round_it_missed_and_trains_the_next(task_identity, caplog):
    apps = FlowerApps(
        workload.fedrc_strategy, workload.make_module, workload.make_datamodule,
        num_rounds=workload.ROUNDS, round_timeout=5.0,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        module, _ = run_local(apps, partitions(2), silent_in_round_one)
    held = node_clients(partitions(2)[1], workload.make_datamodule().num_clients).tolist()
    schedule = workload.fedrc_strategy().round_schedule(workload.make_datamodule())
    expected = sorted(set(held) & set(schedule.clients(1).tolist()))
    assert expected, "the case: node B holds some of round 1's clients"
    assert apps.server.dropped == {2: expected}  # round 2, as logged
    assert f"round 2: node {NODE_B} (partition 1) failed" in caplog.text
    assert module.rounds_trained == workload.ROUNDS
    assert module.client_state.seen[expected].all()  # they trained in another round
