"""engine/runtime.py: a client's local setup evaluates the K working copies inside the host's
forward context (Lightning's precision plugin), and the plain local solver is autograd plus the
optimizer itself (what every host's local steps use)."""

from __future__ import annotations

import contextlib

import torch

from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.engine.copies import ClusterCopies
from lightning_fedcluster.engine.losses import evaluate_models
from lightning_fedcluster.engine.runtime import LocalSetup, LocalSolver, untimed
from lightning_fedcluster.engine.task import Task


def _setup(forward_context=contextlib.nullcontext) -> LocalSetup:
    torch.manual_seed(0)
    models = torch.nn.ModuleList([torch.nn.Linear(4, 3) for _ in range(2)])
    return LocalSetup(
        ClusterCopies(models, ()), FedRC(2), Task.CLASSIFICATION, 0, 64, 8, None, False,
        torch.device("cpu"), num_classes=3, forward_context=forward_context,
    )  # fmt: skip


def test_evaluate_is_the_k_models_pass_inside_the_forward_context():
    entered: list[bool] = []

    @contextlib.contextmanager
    def context():
        entered.append(True)
        yield

    setup = _setup(context)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    losses, outputs = setup.evaluate(x, y)
    expected_losses, expected_outputs = evaluate_models(setup.models, x, y, Task.CLASSIFICATION, 64)
    assert entered == [True]
    assert losses.shape == (5, 2) and torch.equal(losses, expected_losses)
    assert torch.equal(outputs, expected_outputs)


def test_the_plain_solver_is_autograd_and_the_optimizer_step():
    setup = _setup()
    optimizer = torch.optim.SGD(setup.models.parameters(), lr=0.5)
    solver = LocalSolver.plain(optimizer)
    before = [p.detach().clone() for p in setup.models.parameters()]
    solver.zero_grad()
    solver.backward(setup.models[0](torch.ones(2, 4)).sum())
    solver.step()
    after = list(setup.models.parameters())
    assert not torch.equal(before[0], after[0])  # model 0 trained
    assert torch.equal(before[2], after[2])  # model 1 had no gradient
    with untimed("local_training"):  # the default timer times nothing
        pass
