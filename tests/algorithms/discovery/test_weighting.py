"""algorithms/discovery/weighting.py: the ω weighting of the copies against hand computations (from
its round on, its ramp, its strength; off by default), through FedRC's E-step into its
contributions, and a fit that is FedRC's before its round (its resume and executor equivalences
run in ``test_grouping.py`` and the ``fedrc_grouping`` workloads)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lightning_fedcluster.algorithms.base import ClientContext, ClientReport, Contribution, LocalPlan
from lightning_fedcluster.algorithms.discovery.weighting import OmegaWeighting
from lightning_fedcluster.algorithms.fedrc import FedRC
from tests.helpers.algorithms import F64, plain_ctx

# omega_weighting_from: from that round index on, copy k of client i weighs N_i · ω_ik, not N_i.
WEIGHTING_OMEGA = torch.tensor([0.9, 0.0, 0.1], dtype=torch.float64)
WEIGHTING_REPORT = ClientReport(gamma=torch.empty(0, 3), omega=WEIGHTING_OMEGA, label_sums=torch.empty(0))
WEIGHTING_PLAN = LocalPlan(clusters=(0, 2))


def _round_context(round_index: int, num_samples: int = 40) -> ClientContext:
    return replace(plain_ctx([1 / 3] * 3, 2, num_samples, client=1), round_index=round_index)


def _weighed(rule: FedRC, context: ClientContext) -> list[Contribution]:
    """The contributions after the rule's components saw the report (the ω weighting's client hook)."""
    nothing = torch.empty(0, 3, dtype=F64)
    report = rule.run_components(WEIGHTING_REPORT, nothing, torch.empty(0, dtype=torch.long), None, context)
    return rule.contributions(report, WEIGHTING_PLAN, context)


def test_from_its_round_each_trained_copy_weighs_n_times_its_omega():
    rule = FedRC(3, omega_weighting_from=5)
    before = _weighed(rule, _round_context(round_index=4))
    assert before == [Contribution(0, 0, 40.0), Contribution(2, 2, 40.0)]  # FedRC's N_i
    for round_index in (5, 9):
        got = _weighed(rule, _round_context(round_index))
        assert got == [Contribution(0, 0, pytest.approx(36.0)), Contribution(2, 2, pytest.approx(4.0))]


def test_a_ramp_moves_each_weight_from_n_to_n_times_omega_in_equal_steps():
    # ramp 3 from round 5: α = 1/4, 2/4, 3/4 in rounds 5, 6, 7, then 1; weight 40 · ((1 − α) + α · ω_ik)
    rule = FedRC(3, omega_weighting_from=5, omega_weighting_ramp=3)
    expected = {4: (40.0, 40.0), 5: (39.0, 31.0), 6: (38.0, 22.0), 7: (37.0, 13.0)}
    expected |= {8: (36.0, 4.0), 20: (36.0, 4.0)}
    for round_index, (first, third) in expected.items():
        got = _weighed(rule, _round_context(round_index))
        assert got == [Contribution(0, 0, pytest.approx(first)), Contribution(2, 2, pytest.approx(third))]


def test_a_ramp_of_zero_is_the_weighting_from_its_first_round():
    plain, ramped = FedRC(3, omega_weighting_from=5), FedRC(3, omega_weighting_from=5, omega_weighting_ramp=0)
    for round_index in (4, 5, 6):
        context = _round_context(round_index)
        assert _weighed(ramped, context) == _weighed(plain, context)


def test_a_strength_stops_alpha_there_with_or_without_a_ramp():
    # strength 1/2: weight 40 · (1/2 + ω_ik/2); with ramp 1, α = 1/4 in round 5, then 1/2
    strong = FedRC(3, omega_weighting_from=5, omega_weighting_strength=0.5)
    ramped = FedRC(3, omega_weighting_from=5, omega_weighting_ramp=1, omega_weighting_strength=0.5)
    for rule, expected in (
        (strong, {4: (40.0, 40.0), 5: (38.0, 22.0), 9: (38.0, 22.0)}),
        (ramped, {4: (40.0, 40.0), 5: (39.0, 31.0), 6: (38.0, 22.0), 9: (38.0, 22.0)}),
    ):
        for round_index, (first, third) in expected.items():
            got = _weighed(rule, _round_context(round_index))
            assert got == [Contribution(0, 0, pytest.approx(first)), Contribution(2, 2, pytest.approx(third))]


def test_off_by_default_every_copy_weighs_n():
    context = _round_context(round_index=50, num_samples=7)
    got = _weighed(FedRC(3), context)
    assert got == [Contribution(0, 0, 7.0), Contribution(2, 2, 7.0)]


def _fit_weights(rounds: int, **options) -> list[torch.Tensor]:
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        3, clients_per_round=6, local_steps=2, executor="loop", config=FedRC.Config(**options)
    )
    trainer = make_trainer(strategy, max_epochs=rounds)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0))
    return [t.detach().clone() for t in trainer.lightning_module.state_dict().values()]


def test_a_fit_is_fedrc_s_before_the_round_and_moves_differently_from_it():
    same = zip(_fit_weights(2), _fit_weights(2, omega_weighting_from=2), strict=True)
    assert all(torch.equal(a, b) for a, b in same)  # round indices 0 and 1: N_i
    after = zip(_fit_weights(3), _fit_weights(3, omega_weighting_from=2), strict=True)
    assert not all(torch.equal(a, b) for a, b in after)


def test_the_component_sets_each_copy_s_multiplier_and_checks_its_values():
    # ramp 1, strength 1/2: α = 1/4 in round 5, then 1/2; multiplier (1 − α) + α · ω_k
    weighting = OmegaWeighting(5, ramp=1, strength=0.5)
    assert [weighting.alpha(r) for r in (4, 5, 6, 30)] == [0.0, 0.25, 0.5, 0.5]
    assert FedRC(
        3, omega_weighting_from=5, omega_weighting_ramp=1, omega_weighting_strength=0.5
    ).components == (weighting,)
    for options, message in (
        ({"start": -1}, "omega_weighting_from must be a number of rounds >= 0, got -1"),
        ({"start": 2, "ramp": 1.5}, "omega_weighting_ramp must be a number of rounds >= 0, got 1.5"),
        ({"start": 2, "strength": 0.0}, "omega_weighting_strength must be a number in"),
    ):
        with pytest.raises(ValueError, match=message):
            OmegaWeighting(**options)
