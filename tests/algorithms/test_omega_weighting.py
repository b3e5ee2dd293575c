"""FedRC's ``omega_weighting_from``: from that round index on, the server weighs client i's copy of
cluster k by N_i · ω_ik instead of N_i. Hand-computed contributions, the option's checks, and a fit
that is FedRC's before the round and not after it (resume: ``test_grouping.py``; loop = vectorised,
1 = 2 processes and Flower: the ``fedrc_grouping`` workloads, which set it)."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.algorithms.base import ClientContext, ClientReport
from lightning_fedcluster.algorithms.client_turn import Contribution, LocalPlan
from lightning_fedcluster.algorithms.fedrc import FedRC

OMEGA = torch.tensor([0.9, 0.0, 0.1], dtype=torch.float64)
REPORT = ClientReport(gamma=torch.empty(0, 3), omega=OMEGA, label_sums=torch.empty(0))
PLAN = LocalPlan(clusters=(0, 2))


def _context(round_index: int, num_samples: int = 40) -> ClientContext:
    uniform, alive = torch.full((3,), 1 / 3), torch.ones(3, dtype=torch.bool)
    return ClientContext(1, round_index, num_samples, num_classes=2, omega=uniform, active=alive)


def test_from_its_round_each_trained_copy_weighs_n_times_its_omega():
    rule = FedRC(3, omega_weighting_from=5)
    before = rule.contributions(REPORT, PLAN, _context(round_index=4))
    assert before == [Contribution(0, 0, 40.0), Contribution(2, 2, 40.0)]  # FedRC's N_i
    for round_index in (5, 9):
        got = rule.contributions(REPORT, PLAN, _context(round_index))
        assert got == [Contribution(0, 0, pytest.approx(36.0)), Contribution(2, 2, pytest.approx(4.0))]


def test_off_by_default_every_copy_weighs_n():
    got = FedRC(3).contributions(REPORT, PLAN, _context(round_index=50, num_samples=7))
    assert got == [Contribution(0, 0, 7.0), Contribution(2, 2, 7.0)]


@pytest.mark.parametrize("value", [-1, True, 1.5, "3"])
def test_a_bad_round_index_is_refused_by_name(value):
    with pytest.raises(ValueError, match="omega_weighting_from must be a round index >= 0"):
        FedRC.Config(omega_weighting_from=value)


def _weights(rounds: int, **options) -> list[torch.Tensor]:
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(3, clients_per_round=6, local_steps=2, executor="loop", **options)
    trainer = make_trainer(strategy, max_epochs=rounds)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0))
    return [t.detach().clone() for t in trainer.lightning_module.state_dict().values()]


def test_a_fit_is_fedrc_s_before_the_round_and_moves_differently_from_it():
    same = zip(_weights(2), _weights(2, omega_weighting_from=2), strict=True)
    assert all(torch.equal(a, b) for a, b in same)  # round indices 0 and 1: N_i
    after = zip(_weights(3), _weights(3, omega_weighting_from=2), strict=True)
    assert not all(torch.equal(a, b) for a, b in after)
