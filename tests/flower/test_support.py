"""flower/support.py: which strategies run on Flower (each refusal names its reason), the plan a node
receives, the module the nodes train, and the round's hyperparameters the server sends."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn

import lightning_fedcluster as lf
from lightning_fedcluster import ClusteredModule
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.flower.support import (
    check_supported,
    clustered_module,
    flower_optimizer,
    plan_of,
    round_hyperparameters,
    set_round_hyperparameters,
    unsupported_reason,
)
from lightning_fedcluster.models import MLPClassifier


@pytest.mark.parametrize(
    ("strategy", "reason"),
    [
        (lambda tmp: lf.FedRCStrategy(2, optimizer_state="persist"), None),
        (lambda tmp: lf.FedRCStrategy(
            3, config=FedRC.Config(reseed_threshold=0.05),
        ), None),  # the nodes hold no state to split
        (lambda tmp: lf.FedSoftStrategy(2), None),  # one personal copy
        (lambda tmp: lf.DFedEMStrategy(2), "it mixes the clients' personal models on the server (D-FedEM)"),
        (lambda tmp: lf.FedRCStrategy(2, finetune_epochs=1), "finetune_epochs (FedRC-FT)"),
        (
            lambda tmp: lf.FedRCStrategy(
                3, config=FedRC.Config(reseed_threshold=0.05), optimizer_state="persist",
            ),
            "reseed_threshold with optimizer_state='persist'",
        ),
        (
            lambda tmp: lf.FedRCStrategy(2, optimizer_state="persist", optimizer_state_dtype="bfloat16"),
            "optimizer_state_dtype='bfloat16'",
        ),
        (
            lambda tmp: lf.FedRCStrategy(2, optimizer_state="persist", optimizer_state_dir=tmp),
            "optimizer_state_dir: a node keeps its optimizer-state store in Flower's context",
        ),
        (
            lambda tmp: lf.FedRCStrategy(2, precision_plugin=MixedPrecision("bf16-mixed", "cpu")),
            "precision='bf16-mixed'",
        ),
    ],
)
def test_each_unsupported_setting_is_named(strategy, reason, tmp_path):
    found = unsupported_reason(strategy(tmp_path))
    assert found is None if reason is None else reason in found


def test_an_unsupported_strategy_is_refused_naming_it_and_the_supported_ones():
    with pytest.raises(NotImplementedError) as error:
        plan_of(lf.DFedEMStrategy(2))
    message = str(error.value)
    assert message.startswith("DFedEMStrategy (DFedEM) is not supported on Flower yet: it mixes")
    assert "Supported: FedRCStrategy" in message and message.endswith(
        "run the others with the Lightning engine"
    )
    strategy = lf.IFCAStrategy(2, local_steps=3)
    check_supported(strategy)
    assert plan_of(strategy) == strategy.plan and plan_of(strategy).local_steps == 3  # built per call


def test_the_nodes_train_the_module_the_lightning_engine_would():
    plan = lf.FedRCStrategy(3, seed=4).plan
    module = clustered_module(plan, MLPClassifier(hidden=(4,)))
    reference = ClusteredModule(MLPClassifier(hidden=(4,)), 3, seed=4)
    assert module.num_clusters == 3
    for a, b in zip(module.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the same seeded copies
    assert clustered_module(plan, module) is module  # a ClusteredModule as it is


def test_a_nodes_solver_is_the_users_optimizer_over_every_copy():
    copies = [MLPClassifier(hidden=(4,), lr=0.3) for _ in range(2)]
    optimizer = flower_optimizer(copies)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.3
    assert len(optimizer.param_groups[0]["params"]) == sum(len(list(c.parameters())) for c in copies)


def two_groups(optimizer: type[torch.optim.Optimizer], **settings) -> torch.optim.Optimizer:
    first, second = nn.Linear(2, 2), nn.Linear(2, 1)
    return optimizer([{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.2}], **settings)


def test_the_scheduled_hyperparameters_travel_per_parameter_group():
    sent = round_hyperparameters(two_groups(torch.optim.SGD, lr=0.1, momentum=0.9))
    assert {name: value.tolist() for name, value in sent.items()} == {
        "hyper.lr": [0.1, 0.2],
        "hyper.momentum": [0.9, 0.9],
    }  # SGD has no betas
    assert all(value.dtype == torch.float64 for value in sent.values())
    adam = two_groups(torch.optim.Adam, lr=0.01, betas=(0.5, 0.6))
    assert round_hyperparameters(adam)["hyper.betas"].tolist() == [[0.5, 0.6], [0.5, 0.6]]

    node = two_groups(torch.optim.SGD, lr=1.0, momentum=0.0)
    set_round_hyperparameters(node, sent)
    assert [(g["lr"], g["momentum"]) for g in node.param_groups] == [(0.1, 0.9), (0.2, 0.9)]
    set_round_hyperparameters(
        adam, {"hyper.betas": torch.tensor([[0.1, 0.2], [0.3, 0.4]], dtype=torch.float64)}
    )
    assert [g["betas"] for g in adam.param_groups] == [(0.1, 0.2), (0.3, 0.4)]


def test_a_tensor_learning_rate_is_filled_in_place_and_another_group_layout_is_refused():
    lr = torch.tensor(0.01)
    optimizer = torch.optim.Adam(nn.Linear(2, 1).parameters(), lr=lr)
    set_round_hyperparameters(optimizer, {"hyper.lr": torch.tensor([0.5], dtype=torch.float64)})
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == 0.5
    with pytest.raises(
        ValueError, match="the server's local solver has 2 parameter groups but this node's has 1"
    ):
        set_round_hyperparameters(optimizer, {"hyper.lr": torch.tensor([0.1, 0.2])})
