"""The Flower server checks every node's reply before it merges it (``engine/reply_checks.py``):
a poisoned reply (NaN, ×1e6, ω off the simplex, other shapes, garbage) is left out of the round,
named with its node and clients and counted, and the run ends with the weights of a run that
dropped the same client-rounds; a round in which no reply is accepted stops the run. The server
merges what its nodes send as declared (scope, reduction), per-cluster entries included when K
equals the number of clients, into the same store as the Lightning engine."""

from __future__ import annotations

import logging

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster import FederatedStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.federation import NoClientsError
from lightning_fedcluster.flower import FlowerApps, read_run, records
from lightning_fedcluster.models import MLPClassifier
from tests.engine.test_reply_checks import LOUD, loud_datamodule
from tests.engine.test_round import K, M, TallyIFCA, _fit
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local

NODE_B = 101  # partition 1 of 2: clients 3, 4, 5
ROUNDS = 3


def strategy() -> lf.FedAvgStrategy:
    return lf.FedAvgStrategy(clients_per_round=5, local_steps=2, executor="loop", max_update_norm=5.0)


def apps(module=workload.make_module, datamodule=workload.make_datamodule) -> FlowerApps:
    return FlowerApps(strategy, module, datamodule, num_rounds=ROUNDS, collect_client_state=True)


def poisoning(poison, nodes=(NODE_B,), first_round: int = 1, last_round: int = 10**6):
    """Wrap the ClientApp: the train replies of ``nodes`` in rounds ``first_round`` to
    ``last_round`` go through ``poison``."""

    def wrap(app):
        def run(message, context):
            reply = app(message, context)
            train = message.metadata.message_type == "train"
            late = train and first_round <= int(message.metadata.group_id) <= last_round
            if late and context.node_id in nodes and not reply.has_error():
                sections = records.unpack(reply.content)
                poison(sections)
                reply.content = records.pack(sections)
            return reply

        return run

    return wrap


def silent_from_round_one(node, message):
    """The reference: node B answers round 0 and then never again (dropped, as a rejection drops it)."""
    late = message.metadata.message_type == "train" and int(message.metadata.group_id) >= 1
    return "silent" if late and node == NODE_B else None


def nan_update(sections):
    sections["update"]["cluster.0.0"][0, 0] = float("nan")


def scaled_update(sections):  # a finite reply a million times too long
    for name, tensor in sections["update"].items():
        sections["update"][name] = tensor * 1e6


def nan_omega(sections):
    sections["report"]["omega"][0, 0] = float("nan")


def flipped_omega(sections):  # the row sums to 0.9985
    sections["report"]["omega"][0] *= 0.9985


def wrong_shape(sections):
    sections["report"]["label_sums"] = sections["report"]["label_sums"][:, :5]


def forged_client(sections):
    sections["report"]["clients"][0] = 0  # a client node B does not hold


def garbage(sections):
    sections.clear()
    sections["update"] = {"cluster.0.0": torch.zeros(1)}


@pytest.mark.parametrize(
    ("poison", "reason"),
    [
        (nan_update, "non-finite values in cluster 0"),
        (scaled_update, "exceeds max_update_norm=5"),
        (nan_omega, "client 3's ω holds non-finite values"),
        (flipped_omega, "ω is not on the simplex of the alive clusters (sum 0.9985"),
        (wrong_shape, "label_sums is float64 (3, 5, 1), declared float64 (3, 10, 1)"),
        (forged_client, "but was sent"),
        (garbage, "sections ['update'], expected ['report', 'update']"),
    ],
)
def test_a_poisoned_reply_is_rejected_and_the_run_equals_one_that_dropped_it(
    poison, reason, task_identity, caplog
):
    reference, _ = run_local(apps(), partitions(2), silent_from_round_one)
    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        poisoned, _ = run_local(apps(), partitions(2), replies=poisoning(poison))
    for name, tensor in reference.state_dict().items():
        assert torch.equal(poisoned.state_dict()[name], tensor), name
    rejections = [r.getMessage() for r in caplog.records if "is rejected" in r.getMessage()]
    schedule = strategy().round_schedule(workload.make_datamodule())
    b_rounds = [r for r in range(1, ROUNDS) if any(c >= 3 for c in schedule.clients(r).tolist())]
    assert len(rejections) == len(b_rounds) and b_rounds
    assert "the reply of node 101 (partition 1, clients [" in rejections[0] and reason in rejections[0]
    assert all(bool(torch.isfinite(t).all()) for t in poisoned.state_dict().values())
    assert torch.equal(poisoned.client_state.omega, reference.client_state.omega)
    assert torch.equal(poisoned.client_state.seen, reference.client_state.seen)
    last = [c for c in schedule.clients(ROUNDS - 1).tolist() if c >= 3]
    assert poisoned.round_metrics["train/rejected"] == len(last)
    assert poisoned.round_metrics["train/loss"] == reference.round_metrics["train/loss"]


def test_the_rejected_clients_are_saved_with_the_run(tmp_path, task_identity):
    saved = tmp_path / "run.pt"
    run_apps = apps()
    run_apps.save_path = str(saved)
    run_local(run_apps, partitions(2), replies=poisoning(nan_update))
    assert run_apps.server.rejected and all(c >= 3 for cs in run_apps.server.rejected.values() for c in cs)
    assert read_run(saved).rejected == run_apps.server.rejected


def test_a_round_in_which_every_reply_is_rejected_stops_the_run(task_identity):
    with pytest.raises(NoClientsError, match="round 2 trained no client"):
        run_local(apps(), partitions(2), replies=poisoning(nan_update, nodes=(100, 101)))


def test_a_client_rejected_on_its_node_equals_the_lightning_engine(task_identity, caplog):
    """Node B rejects its loud client 4 itself (the reply lists it as rejected): the run equals
    the Lightning engine's, which rejects the same client (tests/engine/test_reply_checks.py)."""
    from tests.engine.test_reply_checks import fit

    with caplog.at_level(logging.WARNING, logger="lightning_fedcluster.flower"):
        flower, _ = run_local(apps(workload.MomentumMLP, loud_datamodule), partitions(2))
    lightning, _ = fit(strategy())
    for name, tensor in lightning.state_dict().items():
        torch.testing.assert_close(flower.state_dict()[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert f"the reply of client {LOUD} is rejected" in caplog.text
    assert not bool(flower.client_state.seen[LOUD]) and flower.round_metrics["train/rejected"] == 1.0


def test_declared_entries_of_every_scope_merge_as_on_lightning(task_identity):
    apps = FlowerApps(
        lambda: FederatedStrategy(algorithm=TallyIFCA(K), local_steps=2, executor="loop"),
        MLPClassifier,
        lambda: DigitsFederated(num_clients=M, concepts=1, seed=0),
        num_rounds=2,
        collect_client_state=True,
    )
    flower, _ = run_local(apps, partitions(2))
    lightning, _ = _fit("loop")
    for name in ("mass", "last_round", "mean_size", "bias"):
        assert torch.equal(flower.client_state.extra[name], lightning.client_state.extra[name]), name
    assert torch.equal(flower.client_state.omega, lightning.client_state.omega)
    for k in range(K):
        for a, b in zip(flower.cluster_tensors(k), lightning.cluster_tensors(k), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
