"""engine/plan.py: the frozen ``TrainingPlan`` the engine reads: K from the rule only, its derived
settings (persistence, reply limits, store dtype), and a copy that survives pickling (the Flower
apps ship it to the nodes)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import IFCA, FedRC
from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig
from lightning_fedcluster.engine.plan import EXECUTORS, TrainingPlan
from lightning_fedcluster.engine.reply_checks import ReplyLimits


def test_k_is_the_rules_and_the_defaults_reset_the_optimizer_state():
    plan = TrainingPlan("IFCA", IFCA(4))
    assert plan.num_clusters == 4
    assert not plan.persists_optimizer_state and plan.optimizer_store_dtype == torch.float32
    assert plan.reply_limits == ReplyLimits(None, 1)
    assert plan.server_optimizer == ServerOptimizerConfig("none") and plan.executor == "auto"
    assert EXECUTORS == ("auto", "loop", "vectorized")


@pytest.mark.parametrize(("name", "dtype"), [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_the_derived_settings_follow_the_fields(name, dtype):
    plan = TrainingPlan(
        "FedRC", FedRC(2), optimizer_state="persist", optimizer_state_dtype=name, max_update_norm=3.0,
        min_clients_per_round=2,
    )  # fmt: skip
    assert plan.persists_optimizer_state and plan.optimizer_store_dtype == dtype
    assert plan.reply_limits == ReplyLimits(3.0, 2)


def test_the_plan_is_frozen_and_survives_pickling():
    plan = lf.FedRCStrategy(3, local_epochs=2, drop_last=True, seed=7, server_optimizer="adam").plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 8
    copy = pickle.loads(pickle.dumps(plan))
    assert isinstance(copy.rule, FedRC) and copy.num_clusters == 3
    fields = [f.name for f in dataclasses.fields(TrainingPlan) if f.name != "rule"]
    assert {f: getattr(copy, f) for f in fields} == {f: getattr(plan, f) for f in fields}
    assert (copy.name, copy.seed, copy.local_steps, copy.local_epochs) == ("FedRC", 7, None, 2)
