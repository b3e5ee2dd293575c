"""Node failures, bad node configuration, unsupported strategies and the server's TensorBoard
log, on an in-process grid running the real ServerApp and ClientApp code."""

from __future__ import annotations

import importlib
import logging
import re
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.engine import estep_reuse
from lightning_fedcluster.engine.executors import loop
from lightning_fedcluster.flower import FlowerApps, records
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local
from tests.helpers.tensorboard_text import event_texts

NODE_B = 101  # partition 1 of 2: clients 3, 4, 5


def fedavg_apps(**options) -> FlowerApps:
    return FlowerApps(
        workload.STRATEGIES["fedavg"], workload.make_module, workload.make_datamodule, **options
    )


@pytest.mark.parametrize("fault", ["silent", "unavailable"])
def test_a_node_that_disconnects_mid_run_is_dropped_logged_and_asked_again(task_identity, caplog, fault):
    rounds = []

    def disconnect(node: int, message) -> str | None:  # node B answers round 0, then goes away
        if message.metadata.message_type == "train" and node == NODE_B:
            rounds.append(int(message.metadata.group_id))
            return fault if int(message.metadata.group_id) >= 1 else None
        return None

    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        module, _ = run_local(fedavg_apps(num_rounds=3), partitions(2), disconnect)
    schedule = workload.STRATEGIES["fedavg"]().round_schedule(workload.make_datamodule())
    b_clients = [[c for c in schedule.clients(r).tolist() if c >= 3] for r in range(3)]
    assert rounds == [0, 1, 2], "a lost node that the grid lists again is asked again the next round"
    reason = "failed (no reply" if fault == "silent" else "failed (node unavailable)"
    assert caplog.text.count(reason) == 2 and caplog.text.count("failed (") == 2
    assert "dropped from this round's aggregation" in caplog.text
    # Rounds are named 1-based, as the progress lines ("round 2/3") do: node B failed the second.
    assert f"round 2: node {NODE_B} (partition 1) failed (" in caplog.text
    assert f"round 3: node {NODE_B} (partition 1) failed (" in caplog.text, "asked again, failed again"
    assert module.round_metrics["train/clients"] == len(schedule.clients(2)) - len(b_clients[2])
    assert all(bool(torch.isfinite(t).all()) for t in module.state_dict().values())
    seen = module.client_state.seen
    assert seen[b_clients[0]].all() and not seen[[c for c in range(3, 6) if c not in b_clients[0]]].any()


def test_a_node_whose_clientapp_fails_is_dropped(task_identity, caplog):
    def corrupt(node: int, message) -> None:
        if message.metadata.message_type == "train" and node == NODE_B:
            sections = records.unpack(message.content)  # a client B does not hold: B's ClientApp raises
            sections["config"]["clients"] = torch.tensor([0])
            message.content = records.pack(sections)

    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        module, _ = run_local(fedavg_apps(num_rounds=2), partitions(2), corrupt)
    assert "which this node's partition does not hold" in caplog.text
    assert not module.client_state.seen[3:].any() and module.client_state.seen[:3].any()


def test_a_node_lost_in_a_fedsoft_estimation_pass_leaves_its_clients_uniform(task_identity, caplog):
    """FedSoft estimates importance at rounds 0 and 2: node B goes away at the second pass."""

    def away(node: int, message) -> str | None:
        second_pass = message.metadata.group_id == "estimate.2"
        return "unavailable" if node == NODE_B and second_pass else None

    apps = FlowerApps(
        workload.STRATEGIES["fedsoft"], workload.make_module, workload.make_datamodule, num_rounds=3
    )
    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        module, _ = run_local(apps, partitions(2), away)
    importance = module.client_state.extra["importance"]
    assert "node 101 failed its estimation pass (node unavailable)" in caplog.text
    assert "no estimate for clients [3, 4, 5]" in caplog.text
    assert torch.equal(importance[3:], torch.full((3, 2), 0.5, dtype=torch.float64))
    assert not torch.equal(importance[:3], torch.full((3, 2), 0.5, dtype=torch.float64)), "A's were estimated"
    assert (
        module.round_metrics["train/clients"] >= 1 and int(module.client_state.extra["estimated_round"]) == 2
    )


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ([{"num-partitions": 2}, {"partition-id": 1, "num-partitions": 2}], "lacks 'partition-id'"),
        ([{"partition-id": 0}], "lacks 'num-partitions'"),
        ([{"partition-id": 2, "num-partitions": 2}], "partition-id=2 must be between 0 and"),
        (
            [{"partition-id": 0, "num-partitions": 2, "num-clusters": 2}],
            "num-clusters=2 but the run trains K=3",
        ),
        ([{"partition-id": 0, "num-partitions": 2}], "no connected node holds clients [3, 4, 5]"),
        # Two nodes claim partition 0: the second is refused (test_node_registry.py), none holds 1.
        ([{"partition-id": 0, "num-partitions": 2}] * 2, "no connected node holds clients [3, 4, 5]"),
    ],
)
def test_bad_node_config_fails_before_training_with_a_named_message(task_identity, configs, message):
    apps = FlowerApps(workload.fedrc_strategy, workload.make_module, workload.make_datamodule)
    with pytest.raises(RuntimeError) as error:
        run_local(apps, configs)
    assert message in str(error.value)


def test_a_node_running_another_k_than_the_server_stops_the_run(task_identity):
    apps = FlowerApps(workload.fedrc_strategy, workload.make_module, workload.make_datamodule)
    apps.node_factory = lambda: FlowerApps(  # the nodes' app builds FedRC with K=2
        lambda: lf.FedRCStrategy(2), workload.make_module, workload.make_datamodule
    ).node_factory()
    with pytest.raises(RuntimeError, match="the server trains K=3 cluster models but this node's FedRC "):
        run_local(apps, partitions(2))


@pytest.mark.parametrize(
    ("strategy", "named"),
    [
        (lambda: lf.DFedEMStrategy(2), "DFedEMStrategy (DFedEM) is not supported on Flower yet: it mixes"),
        (
            lambda: lf.FedRCStrategy(
                3, config=FedRC.Config(reseed_threshold=0.05), optimizer_state="persist",
            ),
            "reseed_threshold with optimizer_state='persist'",
        ),
        (lambda: lf.FedRCStrategy(2, finetune_epochs=1), "finetune_epochs (FedRC-FT)"),
    ],
)
def test_unsupported_strategies_fail_early_naming_the_algorithm(strategy, named):
    with pytest.raises(NotImplementedError, match="Supported: FedRCStrategy") as error:
        FlowerApps(strategy(), workload.make_module(), workload.make_datamodule())
    assert named in str(error.value)


def test_server_logs_the_lightning_round_metrics_to_tensorboard(task_identity, tmp_path):
    run_local(fedavg_apps(num_rounds=3, log_dir=str(tmp_path)), partitions(2))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    for tag in ("train/loss", "train/acc", "train/clients", "clusters/active"):
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3], tag
    losses = [e.value for e in events.Scalars("train/loss")]
    assert losses[-1] < losses[0]


def test_server_logs_each_round_s_server_actions_as_tensorboard_text(task_identity, tmp_path):
    """The retirement after round index 1 (workload ``fedrc_retire``) is written at step 2, as the
    Lightning engine's ClusterMonitor writes it, and no other round has an entry."""
    apps = FlowerApps(
        workload.STRATEGIES["fedrc_retire"], workload.make_module, workload.make_datamodule,
        num_rounds=workload.ROUNDS, log_dir=str(tmp_path),
    )  # fmt: skip
    flower, _ = run_local(apps, partitions(2))
    texts = event_texts(str(tmp_path))
    assert list(texts) == [2] and texts[2].startswith("round 2: retired cluster(s)")
    assert flower.round_events == []  # the last round retired nothing


def test_importing_without_flower_names_the_extra(monkeypatch):
    for name in [n for n in sys.modules if n.startswith("lightning_fedcluster.flower")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flwr", None)
    with pytest.raises(ImportError, match=r'pip install "lightning-fedcluster\[flower\]"'):
        importlib.import_module("lightning_fedcluster.flower")


@pytest.mark.parametrize("value", [-1, 1.5, "2"])
def test_eval_every_rejects_what_is_not_a_round_count(value):
    with pytest.raises(ValueError, match="eval_every must be an integer >= 0"):
        fedavg_apps(eval_every=value)


def test_the_server_says_while_it_waits_for_nodes_and_why_the_run_fails(task_identity, caplog):
    """One of three nodes missing: a line while waiting, then a TimeoutError naming both counts
    (Flower puts the exception's text in the run's status) and a last "run failed" line."""
    apps = fedavg_apps(num_rounds=1, min_nodes=3, node_wait=1.5)
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        with pytest.raises(TimeoutError, match=r"2 of min_nodes=3 Flower nodes connected within 1.5 s "
                           r"\(run config node-wait\): start the missing SuperNodes"):  # fmt: skip
            run_local(apps, partitions(2))
    assert "2 of 3 nodes connected, waiting (2 s left)" in caplog.text
    assert caplog.records[-1].levelname == "ERROR" and "run failed: TimeoutError: 2 of" in caplog.text
    with pytest.raises(ValueError, match="node_wait must be > 0 seconds"):
        fedavg_apps(node_wait=0)


SLOW_START = 3.0  # seconds each node's datamodule takes to build (a node slow to start)


def slow_datamodule():
    """The workload's datamodule, built after a sleep: each node answers the describe step late."""
    time.sleep(SLOW_START)
    return workload.make_datamodule()


def test_the_describe_step_says_what_it_waits_for_and_a_short_node_wait_names_the_remedy(
    task_identity, caplog
):
    """Nodes slow to start: past node_wait the run fails naming node_wait (run config and
    simulate argument) and the machine's load; with a longer wait the server says, while it
    waits, how many nodes have described their clients, and the run trains."""
    slow = {"module": workload.make_module, "datamodule": slow_datamodule, "num_rounds": 1, "min_nodes": 2}
    short = FlowerApps(workload.STRATEGIES["fedavg"], node_wait=SLOW_START / 2, **slow)
    message = (
        r"2 of 2 Flower node\(s\) did not describe their clients within node_wait=1.5 s \(load [0-9.]+ on "
        r"\d+ CPU cores\): .*Raise node_wait: run config node-wait .*or simulate\(\.\.\., node_wait=900\)"
    )
    with pytest.raises(TimeoutError, match=message):
        run_local(short, partitions(2))
    longer = FlowerApps(workload.STRATEGIES["fedavg"], node_wait=60.0, **slow)
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        module, _ = run_local(longer, partitions(2))
    assert module.round_metrics["train/clients"] > 0
    waiting = [r.getMessage() for r in caplog.records if "described their clients, waiting" in r.getMessage()]
    assert waiting and all(
        re.fullmatch(r"[01] of 2 nodes described their clients, waiting \(\d+ s left\)", line)
        for line in waiting
    ), waiting


def test_a_run_says_it_overwrites_an_earlier_runs_save_path(task_identity, caplog, tmp_path):
    saved = tmp_path / "run.pt"
    run_local(fedavg_apps(num_rounds=1, save_path=str(saved)), partitions(2))
    assert saved.exists() and "overwrites" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        run_local(fedavg_apps(num_rounds=1, save_path=str(saved)), partitions(2))
    assert f"save-path {saved} exists (an earlier run's); this run overwrites it" in caplog.text


def test_nodes_train_with_the_e_step_forward_reused_as_without_it_and_refuse_dropout(
    task_identity, monkeypatch
):
    """``reuse_estep_forward=True`` reaches the nodes' loop executor: the run's weights are the
    plain run's within float tolerance (``tests/engine/test_estep_reuse.py``), and a node whose
    model has dropout refuses it, naming the option."""
    calls = []
    monkeypatch.setattr(loop, "reused_pass", lambda *a: calls.append(1) or estep_reuse.reused_pass(*a))

    def apps(reuse: bool, module=workload.make_module) -> FlowerApps:
        def strategy() -> lf.FedRCStrategy:
            return lf.FedRCStrategy(
                3, clients_per_round=4, local_steps=2, optimizer_state="persist", reuse_estep_forward=reuse
            )

        return FlowerApps(strategy, module, workload.make_datamodule, num_rounds=workload.ROUNDS)

    plain, _ = run_local(apps(False), partitions(2))
    assert not calls
    reused, _ = run_local(apps(True), partitions(2))
    assert len(calls) == workload.ROUNDS * 4  # every client turn on the nodes
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(reused.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)

    def dropout_module() -> torch.nn.Module:
        module = workload.make_module()
        module.net = torch.nn.Sequential(torch.nn.Dropout(0.1), module.net)
        return module

    refused = r"rejected the run: ValueError: .* has net\.0 .*reuse_estep_forward=False"
    with pytest.raises(RuntimeError, match=refused):
        run_local(apps(True, dropout_module), partitions(2))
