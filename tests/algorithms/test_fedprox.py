"""algorithms/fedprox.py: FedProx's local plan anchors to the global model."""

import torch

from lightning_fedcluster.algorithms import FedProx
from lightning_fedcluster.algorithms.base import Contribution
from tests.helpers.algorithms import ctx, t

# --- FedProx / FedAvg -----------------------------------------------------------------------------------


def test_fedprox_plan_anchors_to_the_global_model():
    report = FedProx(0.5).e_step(t([[1.0], [2.0]]), torch.tensor([0, 1]), ctx([1.0], num_samples=2), None)
    assert FedProx(0.5).local_plan(report, ctx([1.0])).proximal == (((0, 0.5),),)
    assert FedProx(0.0).local_plan(report, ctx([1.0])).proximal == ()
    assert FedProx(0.0).contributions(
        report, FedProx(0.0).local_plan(report, ctx([1.0])), ctx([1.0], num_samples=2)
    ) == [Contribution(0, 0, 2.0)]
