"""algorithms/fedrc.py: the FedRC/FedEM rule against hand computations on tiny tensors (E-step,
aggregation weights, label statistics, prediction weights, unseen clients) and its options
(Adam on γ, label noise, hard training, cluster removal, the server's ω weighting from a round
on: ``omega_weighting_from``, whose resume and executor equivalences run in ``test_grouping.py``
and the ``fedrc_grouping`` workloads)."""

import math
from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientReport,
    Contribution,
    LocalPlan,
)
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import FedRC, adam_gamma_step, clusters_to_remove
from lightning_fedcluster.algorithms.mixture import (
    iterate_mixture,
    label_statistics,
    label_sums,
    mixture_from_responsibilities,
    responsibilities,
)
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from tests.helpers.algorithms import (
    C_STATS,
    F64,
    GAMMA_FEDEM,
    GAMMA_FEDRC,
    LABELS,
    LOSSES,
    OMEGA,
    OMEGA_FEDRC,
    SUMS_FEDRC,
    TIGHT,
    ctx,
    fixed_point_map,
    plain_ctx,
    server_view,
    store,
    t,
)

# --- FedRC options -------------------------------------------------------------------------------------


def test_adam_gamma_first_step_by_hand():
    # g = γ_prev − γ̃ = [-0.4, 0.4]; after bias correction m̂ = g, v̂ = g², so the step is α·g/(|g|+ε) ≈ ±1.
    previous, target = t([[0.5, 0.5]]), t([[0.9, 0.1]])
    zeros = torch.zeros(1, 2, dtype=F64)
    gamma, m, v = adam_gamma_step(previous, target, zeros, zeros, 0, torch.ones(2, dtype=torch.bool))
    assert_close(m, t([[-0.04, 0.04]]), **TIGHT)
    assert_close(v, t([[0.0016, 0.0016]]), **TIGHT)
    assert_close(gamma, t([[1.0, 0.0]]), **TIGHT)  # [1.5, -0.5] clamped at 0, renormalised


def test_adam_gamma_rule_keeps_per_sample_state():
    rule = FedRC(2, use_label_stats=False, adam_gamma=True)
    extra = {k: v[:2] if v.dim() == 2 else v[0] for k, v in store(rule, 3, num_samples=5).extra.items()}
    context = ctx([0.5, 0.5], extra=extra, num_samples=2)
    first = rule.e_step(t([[0.1, 2.0], [1.0, 0.9]]), torch.tensor([0, 1]), context, None)
    # First participation: γ is the E-step's γ̃ and it is stored for the next round.
    plain = FedRC(2, use_label_stats=False).e_step(
        t([[0.1, 2.0], [1.0, 0.9]]), torch.tensor([0, 1]), ctx([0.5, 0.5], num_samples=2), None
    )
    assert_close(first.gamma, plain.gamma, **TIGHT)
    assert_close(context.extra["gamma"], plain.gamma, **TIGHT)
    later = ctx(first.omega, extra=context.extra, num_samples=2)
    second = rule.e_step(t([[0.1, 2.0], [1.0, 0.9]]), torch.tensor([0, 1]), later, None)
    assert float(later.extra["adam_steps"]) == 1.0
    assert_close(second.omega, second.gamma.mean(0), **TIGHT)
    assert_close(second.gamma.sum(1), torch.ones(2, dtype=F64), **TIGHT)


def test_label_noise_is_gaussian_with_the_clients_sigma():
    losses, labels = t([[0.5, 1.5], [2.0, 0.25], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    clean = FedRC(2).e_step(losses, labels, ctx([0.7, 0.3], seed=9), None)
    noisy = FedRC(2, label_noise_std=[0.0, 2.0]).e_step(
        losses, labels, ctx([0.7, 0.3], client=1, seed=9), None
    )
    expected = 2.0 * torch.randn((2, 2), generator=torch.Generator().manual_seed(9), dtype=F64)
    assert_close(noisy.label_sums - clean.label_sums, expected, **TIGHT)
    assert_close(noisy.gamma, clean.gamma, **TIGHT)  # only what is sent changes
    silent = FedRC(2, label_noise_std=[0.0, 2.0]).e_step(losses, labels, ctx([0.7, 0.3], client=0), None)
    assert torch.equal(silent.label_sums, clean.label_sums)


def test_hard_training_trains_only_the_argmax_cluster():
    rule = FedRC(3, hard_training=True)
    report = ClientReport(
        gamma=t([[0.2, 0.5, 0.3]]), omega=t([0.2, 0.5, 0.3]), label_sums=t([[0.2, 0.5, 0.3]])
    )
    plan = rule.local_plan(report, ctx([1 / 3] * 3))
    assert plan.clusters == (1,) and plan.sample_weights is None
    masked = rule.local_plan(report, ctx([1 / 3] * 3, active=[True, False, True]))
    assert masked.clusters == (2,)


def test_cluster_removal_by_hand_and_state_renormalisation():
    omega = t([[0.9, 0.08, 0.02], [0.5, 0.45, 0.05], [0.0, 0.0, 1.0]])
    sizes = torch.tensor([10, 30, 1000])
    seen = torch.tensor([True, True, False])  # the unseen client does not count
    # shares: (10·[.9,.08,.02] + 30·[.5,.45,.05]) / 40 = [0.6, 0.3575, 0.0425]
    remove = clusters_to_remove(omega, sizes, seen, torch.ones(3, dtype=torch.bool), 0.05)
    assert remove.tolist() == [False, False, True]
    state = ClientState(omega=omega.clone(), label_sums=torch.ones(3, 2, 3, dtype=F64), seen=seen)
    state.remove_clusters(remove)
    assert state.active.tolist() == [True, True, False]
    assert_close(state.omega[0], t([0.9 / 0.98, 0.08 / 0.98, 0.0]), **TIGHT)
    assert_close(state.omega[2], t([0.5, 0.5, 0.0]), **TIGHT)  # all its mass was removed: uniform
    assert torch.equal(state.label_sums[..., 2], torch.zeros(3, 2, dtype=F64))
    # The last cluster standing is never removed, even below the threshold.
    survivors = clusters_to_remove(
        t([[0.5, 0.5, 0.0]]), torch.tensor([1]), torch.tensor([True]), torch.tensor([True, True, False]), 0.9
    )
    assert survivors.tolist() == [False, True, False]  # cluster 0 (the tie's lowest index) stays
    with pytest.raises(ValueError, match="at least one"):
        state.remove_clusters(torch.ones(3, dtype=torch.bool))


def test_removal_waits_for_removal_after_then_removes_as_by_hand():
    # the shares of the test above: [0.6, 0.3575, 0.0425]; δ = 0.05 removes cluster 2
    omega = t([[0.9, 0.08, 0.02], [0.5, 0.45, 0.05], [0.0, 0.0, 1.0]])
    seen = torch.tensor([True, True, False])
    rule = FedRC(3, removal_threshold=0.05, removal_after=5)

    def decide(round_index: int) -> list:
        state = ClientState(omega=omega.clone(), label_sums=torch.ones(3, 2, 3, dtype=F64), seen=seen)
        sizes = torch.tensor([10, 30, 1000])
        outcome = RoundOutcome(round_index, torch.tensor([0, 1]), omega[:2], sizes[:2], sizes)
        return rule.after_round(server_view(state, outcome))

    assert decide(4) == []  # round index 4 < removal_after: no removal, although cluster 2 is below δ
    removal, note = decide(5)
    assert removal.mask.tolist() == [False, False, True]
    assert "removed cluster(s) [2]" in note.text and "2 remain" in note.text
    assert FedRC(3, removal_threshold=0.05).config.removal_after == 0  # the paper's: from the first round


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"removal_after": 3}, "removal_after=3 has no effect without removal_threshold"),
        ({"removal_threshold": 0.1, "removal_after": -1}, "must be a number of rounds >= 0, got -1"),
        ({"removal_threshold": 0.1, "removal_after": True}, "must be a number of rounds >= 0, got True"),
        ({"removal_threshold": 0.1, "removal_after": 2.0}, "must be a number of rounds >= 0, got 2.0"),
    ],
)
def test_removal_after_is_checked(options, message):
    with pytest.raises(ValueError, match=message):
        FedRC(3, **options)


def test_soft_rule_skips_removed_clusters_everywhere():
    rule = Algorithm(3)
    active = [True, False, True]
    report = rule.e_step(t([[0.1, 0.0, 0.3]]), torch.tensor([0]), ctx([0.4, 0.2, 0.4], active=active), None)
    assert report.gamma[0, 1] == 0 and report.omega[1] == 0
    plan = rule.local_plan(report, ctx([0.4, 0.2, 0.4], active=active))
    assert plan.clusters == (0, 2) and plan.sample_weights.shape == (1, 2)
    omega = rule.unseen_client_mixture(t([[0.1, 0.0, 0.3]]), torch.tensor([0]), None, torch.tensor(active))
    assert omega[1] == 0 and math.isclose(float(omega.sum()), 1.0)


# --- the FedRC rule object ------------------------------------------------------------------------


def test_fedrc_e_step_by_hand() -> None:
    rule = FedRC(num_clusters=2)
    report = rule.e_step(
        t(LOSSES, torch.float32), torch.tensor(LABELS), plain_ctx(OMEGA, 3), t(C_STATS).log()
    )
    assert isinstance(report, ClientReport)
    assert report.gamma.dtype == report.omega.dtype == report.label_sums.dtype == F64
    assert_close(report.gamma, t(GAMMA_FEDRC), **TIGHT)
    assert_close(report.omega, t(OMEGA_FEDRC), **TIGHT)
    # num_classes=3: the unused label 2 gets a zero row.
    assert_close(report.label_sums, t([*SUMS_FEDRC, [0.0, 0.0]]), **TIGHT)
    # consistent with the module-level functions
    log_gamma = responsibilities(t(LOSSES), torch.tensor(LABELS), t(OMEGA).log(), t(C_STATS).log())
    assert_close(report.gamma, log_gamma.exp(), **TIGHT)
    assert_close(report.omega, mixture_from_responsibilities(log_gamma).exp(), **TIGHT)
    assert_close(report.label_sums, label_sums(log_gamma.exp(), torch.tensor(LABELS), 3), **TIGHT)
    plan = rule.local_plan(report, plain_ctx(OMEGA, 3))
    assert plan.clusters == (0, 1) and torch.equal(plan.sample_weights, report.gamma)


def test_fedrc_e_step_without_stats_is_fedem() -> None:
    report = FedRC(num_clusters=2, use_label_stats=False).e_step(
        t(LOSSES), torch.tensor(LABELS), plain_ctx(OMEGA, 2), t(C_STATS).log()
    )  # FedEM ignores C even when one is passed
    assert_close(report.gamma, t(GAMMA_FEDEM), **TIGHT)
    omega0 = (0.8638095285778118 + 0.28849552353518315 + 0.7) / 3
    assert_close(report.omega, t([omega0, 1 - omega0]), **TIGHT)


def test_fedrc_single_cluster_is_fedavg() -> None:
    rule = FedRC(num_clusters=1)
    losses = t([[0.3], [5.0], [1000.0], [0.0]])
    labels = torch.tensor([1, 0, 1, 1])
    log_c = label_statistics(torch.zeros(0, 2, 1, dtype=F64)).log()
    report = rule.e_step(losses, labels, plain_ctx([1.0], 2, num_samples=4), log_c)
    assert torch.equal(report.gamma, torch.ones(4, 1, dtype=F64))
    assert_close(report.omega, t([1.0]), **TIGHT)
    assert_close(report.label_sums, t([[1.0], [3.0]]), **TIGHT)  # label counts
    plan = rule.local_plan(report, plain_ctx([1.0], 2, num_samples=4))
    assert rule.contributions(report, plan, plain_ctx([1.0], 2, num_samples=4)) == [Contribution(0, 0, 4.0)]


def test_fedrc_aggregation_weights_are_client_size_for_every_cluster() -> None:
    rule = FedRC(num_clusters=3)
    context = plain_ctx([0.5, 0.3, 0.2], 2, num_samples=7)
    report = rule.e_step(t([[0.1, 2.0, 3.0], [1.0, 0.5, 0.2]]), torch.tensor([0, 1]), context, None)
    plan = rule.local_plan(report, context)
    assert rule.contributions(report, plan, context) == [Contribution(k, k, 7.0) for k in range(3)]


def test_fedrc_log_label_stats_uses_seen_clients_only() -> None:
    rule = FedRC(num_clusters=2)
    state = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2)
    # Nobody seen: the paper's uniform initial C.
    assert_close(rule.log_label_stats(state), torch.full((2, 2), math.log(0.5), dtype=F64), **TIGHT)
    # An unseen client's (garbage) sums must be ignored.
    state.label_sums[2] = t([[100.0, 100.0], [0.0, 0.0]])
    assert_close(rule.log_label_stats(state), torch.full((2, 2), math.log(0.5), dtype=F64), **TIGHT)

    # Round 1: clients 0 and 1 report.
    s0 = [[1.0, 3.0], [1.0, 0.0]]
    s1 = [[0.5, 0.5], [1.5, 0.5]]
    state.record(torch.tensor([0, 1]), t([[0.5, 0.5], [0.5, 0.5]]), t([s0, s1]))
    # Σ = [[1.5, 3.5], [2.5, 0.5]], column sums 4, 4.
    expected = [[0.375, 0.875], [0.625, 0.125]]
    assert_close(rule.log_label_stats(state), t(expected).log(), **TIGHT)

    # Round 2: only client 0 reports; client 1's stale sums are kept and used.
    s0_new = [[2.0, 1.0], [0.0, 1.0]]
    state.record(torch.tensor([0]), t([[0.6, 0.4]]), t([s0_new]))
    # Σ = s0_new + s1 = [[2.5, 1.5], [1.5, 1.5]], column sums 4, 3.
    expected = [[0.625, 0.5], [0.375, 0.5]]
    assert_close(rule.log_label_stats(state), t(expected).log(), **TIGHT)


def test_fedrc_without_label_stats_returns_none() -> None:
    state = ClientState.initial(num_clients=2, num_classes=2, num_clusters=2)
    state.record(torch.tensor([0]), t([[0.5, 0.5]]), t([[[1.0, 2.0], [3.0, 4.0]]]))
    assert FedRC(num_clusters=2, use_label_stats=False).log_label_stats(state) is None


def test_fedrc_prediction_weights_soft_and_hard() -> None:
    omega = t([0.3, 0.3, 0.4])
    assert torch.equal(FedRC(num_clusters=3).prediction_weights(omega), omega)
    assert torch.equal(FedRC(num_clusters=3, hard_prediction=True).prediction_weights(omega), t([0, 0, 1.0]))
    tie = t([0.4, 0.4, 0.2])
    assert torch.equal(FedRC(num_clusters=3, hard_prediction=True).prediction_weights(tie), t([1.0, 0, 0]))


def test_fedrc_unseen_client_mixture_matches_iterate_mixture() -> None:
    losses = t([[0.3, 1.1], [2.0, 0.4], [0.9, 0.8], [1.5, 1.4]], torch.float32)
    labels = torch.tensor([0, 1, 1, 0])
    stats = [[0.3, 0.6], [0.7, 0.4]]
    omega = FedRC(num_clusters=2).unseen_client_mixture(losses, labels, t(stats).log())
    assert_close(omega, iterate_mixture(losses.double(), labels, t(stats).log()), **TIGHT)
    mapped = fixed_point_map(omega.tolist(), losses.double().tolist(), labels.tolist(), stats)
    assert max(abs(a - b) for a, b in zip(mapped, omega.tolist(), strict=True)) < 1e-6


def test_round_one_uniform_gamma_gives_label_prior_and_fedem_e_step() -> None:
    # Three clients with uniform γ (K = 3): S_{i,y,k} = n_{i,y} / K.
    k = 3
    client_labels = [[0, 0, 1], [1, 1, 1, 2], [0, 2]]
    sums = torch.stack(
        [label_sums(torch.full((len(y), k), 1 / k, dtype=F64), torch.tensor(y), 3) for y in client_labels]
    )
    stats = label_statistics(sums)
    # label counts 3, 4, 2 over 9 samples: every column is the label prior.
    prior = [3 / 9, 4 / 9, 2 / 9]
    assert_close(stats, t([[p] * k for p in prior]), **TIGHT)

    rule = FedRC(num_clusters=k)
    losses = t([[0.2, 1.0, 3.0], [2.5, 0.1, 0.7], [1.0, 1.0, 0.1], [0.4, 0.9, 0.2]])
    labels = torch.tensor([0, 1, 2, 1])
    omega = t([0.5, 0.2, 0.3])
    fedrc = rule.e_step(losses, labels, plain_ctx(omega, 3, 4), stats.log())
    fedem = rule.e_step(losses, labels, plain_ctx(omega, 3, 4), None)
    assert_close(fedrc.gamma, fedem.gamma, **TIGHT)
    assert_close(fedrc.omega, fedem.omega, **TIGHT)
    assert_close(fedrc.label_sums, fedem.label_sums, **TIGHT)


def test_label_stats_floor_caps_the_pull_of_a_label_a_cluster_lacks() -> None:
    import lightning_fedcluster as lf

    state = ClientState.initial(2, 2, 2)
    state.seen[:] = True
    # Cluster 1 holds no row of label 0: C_{0,1} is the floor.
    state.label_sums[0] = torch.tensor([[3.0, 0.0], [1.0, 2.0]], dtype=F64)
    state.label_sums[1] = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=F64)
    assert_close(FedRC(2).log_label_stats(state)[0, 1], torch.tensor(math.log(1e-8), dtype=F64))
    rule = lf.FedRCStrategy(2, config=FedRC.Config(label_stats_floor=0.01)).algorithm
    assert rule.config.label_stats_floor == 0.01
    assert_close(rule.log_label_stats(state)[0, 1], torch.tensor(math.log(0.01), dtype=F64))
    assert_close(rule.log_label_stats(state)[:, 0], torch.tensor([0.8, 0.2], dtype=F64).log())
    for bad in (0.0, 1.0, True):
        with pytest.raises(ValueError, match="label_stats_floor must be in"):
            FedRC(2, label_stats_floor=bad)


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
