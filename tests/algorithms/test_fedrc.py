"""algorithms/fedrc.py: the FedRC/FedEM rule against hand computations on tiny tensors (E-step,
aggregation weights, label statistics, prediction weights, unseen clients) and its options
(Adam on γ, label noise, hard training); its discovery components (removal, the ω weighting, ...)
are tested in ``tests/algorithms/discovery/``."""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.base import (
    Algorithm,
    ClientReport,
    Contribution,
)
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import FedRC, adam_gamma_step
from lightning_fedcluster.algorithms.mixture import (
    iterate_mixture,
    label_statistics,
    label_sums,
    mixture_from_responsibilities,
    responsibilities,
)
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
