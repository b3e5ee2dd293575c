"""strategies/round_arguments.py: the strategy's settings in four frozen groups, each checked once
on construction with errors naming the argument (and the fix where there is one); the strategy
stores the groups and builds its plan from them."""

from __future__ import annotations

import dataclasses

import pytest

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig
from lightning_fedcluster.strategies.round_arguments import (
    Execution,
    LocalTraining,
    Sampling,
    ServerUpdate,
    algorithm_clusters,
)


def test_valid_groups_pass_and_local_steps_defaults_to_five_without_epochs() -> None:
    assert LocalTraining().local_steps == 5 and LocalTraining(local_epochs=2).local_steps is None
    assert LocalTraining(local_epochs=2, drop_last=True, finetune_epochs=3).drop_last
    assert Sampling(3, 3).clients_per_round == 3 and Sampling(None, 7).min_clients_per_round == 7
    assert Execution("vectorized", 8).clients_per_chunk == 8
    assert ServerUpdate(0.01, ServerOptimizerConfig("adam"), 10).max_update_norm == 10.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sampling().clients_per_round = 4


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Sampling(clients_per_round=0), "clients_per_round"),
        (lambda: LocalTraining(local_steps=2.5), "local_steps"),
        (lambda: LocalTraining(local_epochs=0), "local_epochs"),
        (
            lambda: LocalTraining(local_steps=5, local_epochs=1),
            "give either local_steps or local_epochs, not both",
        ),
        (lambda: LocalTraining(local_epochs=1, drop_last=1), "drop_last must be True or False, got 1"),
        (lambda: LocalTraining(drop_last=True), "drop_last applies to local_epochs .*give local_epochs"),
        (lambda: LocalTraining(finetune_epochs=-1), "finetune_epochs must be an integer >= 0, got -1"),
        (lambda: LocalTraining(finetune_epochs=True), "finetune_epochs must be an integer >= 0, got True"),
        (lambda: LocalTraining(optimizer_state="keep"), "optimizer_state must be one of"),
        (
            lambda: LocalTraining(optimizer_state_dtype="float16"),
            "applies to the store of optimizer_state='persist'",
        ),
        (
            lambda: Execution(executor="gpu"),
            r"executor must be one of \('auto', 'loop', 'vectorized'\), got 'gpu'",
        ),
        (lambda: Execution(clients_per_chunk=0), "clients_per_chunk"),
        (lambda: ServerUpdate(server_lr=0.0), "server_lr must be > 0, got 0.0"),
        (lambda: lf.FedRCStrategy(2, seed=2**32), r"seed must be an integer in \[0, 2\*\*32\)"),
    ],
)
def test_a_bad_setting_is_refused_by_name(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_drop_last_needs_local_epochs():
    with pytest.raises(ValueError, match="drop_last applies to local_epochs"):
        lf.FedRCStrategy(2, local_steps=3, drop_last=True)


def test_the_strategy_stores_the_groups_and_builds_its_plan_from_them() -> None:
    strategy = lf.FedRCStrategy(
        2, clients_per_round=4, min_clients_per_round=2, local_epochs=1, server_lr=0.5,
        server_optimizer="momentum", executor="loop", max_update_norm=3, seed=9, gradient_clip_val=2,
    )  # fmt: skip
    assert strategy.sampling == Sampling(4, 2)
    assert strategy.local_training == LocalTraining(local_epochs=1, gradient_clip_val=2.0)
    assert strategy.server_update == ServerUpdate(0.5, ServerOptimizerConfig("momentum"), 3.0)
    assert strategy.execution == Execution("loop")
    loose_names = (
        "clients_per_round", "local_steps", "server_lr", "executor", "max_update_norm", "gradient_clip_val"
    )
    for loose in loose_names:
        assert not hasattr(strategy, loose), f"{loose} has a second home on the strategy"
    plan = strategy.plan
    assert (plan.clients_per_round, plan.min_clients_per_round, plan.local_epochs) == (4, 2, 1)
    assert (plan.local_steps, plan.server_lr, plan.executor, plan.max_update_norm) == (None, 0.5, "loop", 3.0)
    assert plan.server_optimizer.kind == "momentum" and plan.seed == 9 and plan.rule is strategy.algorithm
    assert plan.gradient_clip_val == 2.0 and isinstance(plan.gradient_clip_val, float)


def test_valid_reply_settings_pass() -> None:
    Sampling(None, 1)
    Sampling(3, 3)
    Sampling(None, 7)  # no clients_per_round: every client takes part
    ServerUpdate(max_update_norm=0.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_update_norm": 0}, "max_update_norm must be a number > 0"),
        ({"max_update_norm": "big"}, "max_update_norm must be a number > 0"),
        ({"min_clients_per_round": 0}, "min_clients_per_round"),
        (
            {"clients_per_round": 3, "min_clients_per_round": 4},
            "min_clients_per_round=4 exceeds clients_per_round=3",
        ),
    ],
)
def test_bad_reply_settings_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        lf.FedAvgStrategy(**options)


def test_algorithm_clusters_takes_k_from_the_rule_and_refuses_what_cannot_be_meant() -> None:
    assert algorithm_clusters("S", FedRC(4), None, builds_own=False, base=True) == 4
    assert algorithm_clusters("S", None, 3, builds_own=True, base=False) == 3
    assert algorithm_clusters("S", None, None, builds_own=True, base=False) == 1
    with pytest.raises(ValueError, match="num_clusters=2 but the algorithm has num_clusters=4: set K once"):
        algorithm_clusters("S", FedRC(4), 2, builds_own=False, base=True)
    with pytest.raises(TypeError, match="FederatedStrategy needs the algorithm to run"):
        algorithm_clusters("FederatedStrategy", None, 3, builds_own=False, base=True)
    with pytest.raises(TypeError, match="FedRCStrategy builds its own algorithm"):
        algorithm_clusters("FedRCStrategy", FedRC(3), None, builds_own=True, base=False)
    with pytest.raises(TypeError, match="an Algorithm\\), got str"):
        algorithm_clusters("S", "fedrc", None, builds_own=False, base=True)
