"""Pure tensor math of the algorithms (E-step, label statistics, FedRC rules, aggregation, client
state) checked against numbers computed by hand with plain Python ``math``."""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update
from lightning_fedcluster.algorithms.base import ClientContext, ClientReport, Contribution
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.mixture import (
    LABEL_STATS_FLOOR,
    hard_weights,
    iterate_mixture,
    label_statistics,
    label_sums,
    mixture_from_responsibilities,
    mixture_probabilities,
    responsibilities,
)

F64 = torch.float64
TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def t(values, dtype=F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def ctx(omega, num_classes, num_samples=3, client=0) -> ClientContext:
    omega = torch.as_tensor(omega, dtype=F64)
    return ClientContext(
        client=client,
        round_index=0,
        num_samples=num_samples,
        num_classes=num_classes,
        omega=omega,
        active=torch.ones(len(omega), dtype=torch.bool),
    )


# --- the running example: 3 samples, 2 clusters, 2 classes --------------------------------------
#
# f = [[0.5, 1.5], [2.0, 0.25], [1.0, 1.0]], y = [0, 1, 1], ω = [0.7, 0.3],
# C = [[0.6, 0.2], [0.4, 0.8]] (rows: label y, columns: cluster k; each column sums to 1).
# γ_jk ∝ ω_k · exp(−f_jk) / C_{y_j,k}, e.g.
#   γ_00 = (0.7 e^−0.5 / 0.6) / (0.7 e^−0.5 / 0.6 + 0.3 e^−1.5 / 0.2)
#   γ_20 = (0.7 / 0.4) / (0.7 / 0.4 + 0.3 / 0.8) = 1.75 / 2.125 = 14/17 (equal losses cancel)

LOSSES = [[0.5, 1.5], [2.0, 0.25], [1.0, 1.0]]
LABELS = [0, 1, 1]
OMEGA = [0.7, 0.3]
C_STATS = [[0.6, 0.2], [0.4, 0.8]]

GAMMA_FEDRC = [
    [0.6788922244047344, 0.32110777559526565],
    [0.4478021355381227, 0.5521978644618774],
    [14 / 17, 3 / 17],
]
# FedEM (C ≡ 1): γ_jk ∝ ω_k exp(−f_jk); the third row is ω itself since its losses are equal.
GAMMA_FEDEM = [
    [0.8638095285778118, 0.13619047142218818],
    [0.28849552353518315, 0.7115044764648167],
    [0.7, 0.3],
]
# ω = column means of GAMMA_FEDRC.
OMEGA_FEDRC = [0.6500745905691877, 0.3499254094308124]
# S_{y,k}: label 0 is sample 0 only; label 1 is samples 1 + 2.
SUMS_FEDRC = [
    [0.6788922244047344, 0.32110777559526565],
    [0.4478021355381227 + 14 / 17, 0.5521978644618774 + 3 / 17],
]


def running_example():
    return t(LOSSES), torch.tensor(LABELS), t(OMEGA).log(), t(C_STATS).log()


# --- responsibilities -------------------------------------------------------------------------


def test_responsibilities_fedrc_by_hand() -> None:
    losses, labels, log_omega, log_c = running_example()
    log_gamma = responsibilities(losses, labels, log_omega, log_c)
    assert log_gamma.shape == (3, 2)
    assert_close(log_gamma.exp(), t(GAMMA_FEDRC), **TIGHT)
    assert_close(log_gamma.exp().sum(dim=1), torch.ones(3, dtype=F64), **TIGHT)


def test_responsibilities_without_label_stats_is_fedem() -> None:
    losses, labels, log_omega, _ = running_example()
    gamma = responsibilities(losses, labels, log_omega, None).exp()
    assert_close(gamma, t(GAMMA_FEDEM), **TIGHT)


@pytest.mark.parametrize(
    "constant_in_k",
    [
        [[0.5, 0.5], [0.5, 0.5]],  # uniform C (the paper's initial value)
        [[0.3, 0.3], [0.7, 0.7]],  # a label prior, identical for every cluster
    ],
)
def test_label_stats_constant_in_k_have_no_effect(constant_in_k) -> None:
    losses, labels, log_omega, _ = running_example()
    gamma = responsibilities(losses, labels, log_omega, t(constant_in_k).log()).exp()
    assert_close(gamma, t(GAMMA_FEDEM), **TIGHT)


def test_responsibilities_are_log_space_robust() -> None:
    # exp(−1000) underflows to 0 in float64; the log-space softmax must still give
    # γ = (1/(1+e^−1), e^−1/(1+e^−1)) with uniform ω, not NaN.
    losses = t([[1000.0, 1001.0], [1001.0, 1000.0]])
    log_omega = t([0.5, 0.5]).log()
    expected = t([[0.7310585786300049, 0.2689414213699951], [0.2689414213699951, 0.7310585786300049]])
    for dtype in (torch.float64, torch.float32):
        gamma = responsibilities(losses.to(dtype), torch.tensor([0, 1]), log_omega, None).exp()
        assert torch.isfinite(gamma).all()
        assert_close(gamma, expected.to(dtype), rtol=1e-6, atol=1e-7)
    # Same with C: the C factor of the equal-loss example (ω ∝ 0.7/0.4 : 0.3/0.8) survives the shift.
    gamma = responsibilities(t([[1000.0, 1000.0]]), torch.tensor([1]), t(OMEGA).log(), t(C_STATS).log())
    assert_close(gamma.exp(), t([[14 / 17, 3 / 17]]), **TIGHT)
    log_omega_new = mixture_from_responsibilities(responsibilities(losses, torch.tensor([0, 1]), log_omega))
    assert torch.isfinite(log_omega_new).all()
    assert_close(log_omega_new.exp(), t([0.5, 0.5]), **TIGHT)


def test_mixture_from_responsibilities_is_mean_gamma() -> None:
    gamma = t([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]])
    log_omega = mixture_from_responsibilities(gamma.log())
    assert_close(log_omega, t([math.log(1.6 / 3), math.log(1.4 / 3)]), **TIGHT)


# --- label statistics -------------------------------------------------------------------------


def test_label_sums_by_hand() -> None:
    gamma = t([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]])
    sums = label_sums(gamma, torch.tensor([0, 1, 1]), num_classes=3)
    # label 0: sample 0; label 1: samples 1 and 2; label 2: nobody.
    assert_close(sums, t([[0.2, 0.8], [1.4, 0.6], [0.0, 0.0]]), **TIGHT)


def test_label_statistics_by_hand() -> None:
    # Two clients, 3 labels, 3 clusters; cluster 2 has no mass at all.
    client_a = [[1.0, 0.5, 0.0], [2.0, 0.0, 0.0], [0.0, 0.5, 0.0]]
    client_b = [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]
    stats = label_statistics(t([client_a, client_b]))
    # Σ_i S_i = [[1, 1.5, 0], [3, 0, 0], [0, 2.5, 0]], column sums 4, 4, 0.
    third = 1 / 3
    expected = t(
        [
            [0.25, 0.375, third],
            [0.75, LABEL_STATS_FLOOR, third],  # 0 / 4 floored at 1e-8
            [LABEL_STATS_FLOOR, 0.625, third],  # a column with zero mass is uniform
        ]
    )
    assert LABEL_STATS_FLOOR == 1e-8
    assert_close(stats, expected, **TIGHT)
    # A single [C, K] matrix is already the sum over clients.
    summed = [[1.0, 1.5, 0.0], [3.0, 0.0, 0.0], [0.0, 2.5, 0.0]]
    assert_close(label_statistics(t(summed)), expected, **TIGHT)


def test_label_statistics_custom_floor() -> None:
    stats = label_statistics(t([[[4.0, 1.0], [0.0, 1.0]]]), floor=0.01)
    assert_close(stats, t([[1.0, 0.5], [0.01, 0.5]]), **TIGHT)


def test_label_statistics_of_no_clients_is_uniform() -> None:
    stats = label_statistics(torch.zeros(0, 4, 2, dtype=F64))
    assert_close(stats, torch.full((4, 2), 0.25, dtype=F64), **TIGHT)


# --- iterated E-step for unseen clients --------------------------------------------------------


def fixed_point_map(omega: list[float], losses, labels, stats=None) -> list[float]:
    """One E-step in plain Python: mean_j of ω_k e^{−f_jk} / C_{y_j,k}, normalised over k."""
    k_count, n = len(omega), len(losses)
    out = [0.0] * k_count
    for row, y in zip(losses, labels, strict=True):
        weights = [omega[k] * math.exp(-row[k]) / (stats[y][k] if stats else 1.0) for k in range(k_count)]
        total = sum(weights)
        for k in range(k_count):
            out[k] += weights[k] / total / n
    return out


def two_sample_mle(lik: list[list[float]]) -> float:
    """Interior maximiser ω_0 of Σ_j log(ω L_j0 + (1 − ω) L_j1) for two samples (solved by hand:
    Σ_j d_j / (ω d_j + L_j1) = 0 with d_j = L_j0 − L_j1 gives ω = −(d_a L_b1 + d_b L_a1) / (2 d_a d_b))."""
    (a0, a1), (b0, b1) = lik
    da, db = a0 - a1, b0 - b1
    return -(da * b1 + db * a1) / (2 * da * db)


def test_iterate_mixture_reaches_the_fixed_point() -> None:
    losses = [[0.3, 1.1], [2.0, 0.4], [0.9, 0.8], [1.5, 1.4]]
    labels = [0, 1, 1, 0]
    stats = [[0.3, 0.6], [0.7, 0.4]]
    omega = iterate_mixture(t(losses), torch.tensor(labels), t(stats).log())
    assert omega.shape == (2,)
    assert omega.sum().item() == pytest.approx(1.0, abs=1e-12)
    mapped = fixed_point_map(omega.tolist(), losses, labels, stats)
    assert max(abs(a - b) for a, b in zip(mapped, omega.tolist(), strict=True)) < 1e-6


def test_iterate_mixture_matches_closed_form_two_sample_mle() -> None:
    losses = [[0.1, 1.0], [1.5, 0.2]]
    # FedEM: L_jk = e^{−f_jk}.
    expected = two_sample_mle([[math.exp(-f) for f in row] for row in losses])
    assert expected == pytest.approx(0.3447563850551547, abs=1e-15)
    omega = iterate_mixture(t(losses), torch.tensor([0, 1]), None)
    assert_close(omega, t([expected, 1 - expected]), rtol=0, atol=1e-5)
    # FedRC: L_jk = e^{−f_jk} / C_{y_j,k}; still an interior optimum (0.4646524717358023).
    stats, labels = [[0.3, 0.6], [0.7, 0.4]], [0, 1]
    lik = [[math.exp(-losses[j][k]) / stats[labels[j]][k] for k in range(2)] for j in range(2)]
    expected = two_sample_mle(lik)
    assert expected == pytest.approx(0.4646524717358023, abs=1e-15)
    omega = FedRC(num_clusters=2).unseen_client_mixture(
        t(losses, torch.float32), torch.tensor(labels), t(stats).log()
    )
    assert omega.dtype == F64
    assert_close(omega, t([expected, 1 - expected]), rtol=0, atol=1e-5)


def test_iterate_mixture_one_hot_for_perfectly_explained_client() -> None:
    losses = t([[10.0, 0.01], [12.0, 0.02], [9.0, 0.0], [11.0, 0.05]])
    omega = iterate_mixture(losses, torch.tensor([0, 1, 0, 1]), None)
    assert omega[1].item() > 1 - 1e-6
    assert 0 <= omega[0].item() < 1e-6


# --- prediction weights -------------------------------------------------------------------------


def test_mixture_probabilities_by_hand() -> None:
    probs = t(
        [
            [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]],  # cluster 0, two samples, 3 classes
            [[0.6, 0.2, 0.2], [0.0, 0.5, 0.5]],  # cluster 1
        ]
    )
    mixed = mixture_probabilities(probs, t([0.25, 0.75]))
    expected = t(
        [
            [0.25 * 0.2 + 0.75 * 0.6, 0.25 * 0.3 + 0.75 * 0.2, 0.25 * 0.5 + 0.75 * 0.2],
            [0.25, 0.375, 0.375],
        ]
    )
    assert_close(mixed, expected, **TIGHT)
    assert_close(mixed, t([[0.5, 0.225, 0.275], [0.25, 0.375, 0.375]]), **TIGHT)


@pytest.mark.parametrize(
    ("omega", "expected"),
    [
        ([0.2, 0.5, 0.3], [0.0, 1.0, 0.0]),
        ([0.4, 0.4, 0.2], [1.0, 0.0, 0.0]),  # tie -> lowest index
        ([0.1, 0.45, 0.45], [0.0, 1.0, 0.0]),  # tie -> lowest index
        ([1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]),
    ],
)
def test_hard_weights(omega, expected) -> None:
    out = hard_weights(t(omega))
    assert out.dtype == F64
    assert torch.equal(out, t(expected))


# --- the FedRC rule object ------------------------------------------------------------------------


def test_fedrc_e_step_by_hand() -> None:
    rule = FedRC(num_clusters=2)
    report = rule.e_step(t(LOSSES, torch.float32), torch.tensor(LABELS), ctx(OMEGA, 3), t(C_STATS).log())
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
    plan = rule.local_plan(report, ctx(OMEGA, 3))
    assert plan.clusters == (0, 1) and torch.equal(plan.sample_weights, report.gamma)


def test_fedrc_e_step_without_stats_is_fedem() -> None:
    report = FedRC(num_clusters=2, use_label_stats=False).e_step(
        t(LOSSES), torch.tensor(LABELS), ctx(OMEGA, 2), t(C_STATS).log()
    )  # FedEM ignores C even when one is passed
    assert_close(report.gamma, t(GAMMA_FEDEM), **TIGHT)
    omega0 = (0.8638095285778118 + 0.28849552353518315 + 0.7) / 3
    assert_close(report.omega, t([omega0, 1 - omega0]), **TIGHT)


def test_fedrc_single_cluster_is_fedavg() -> None:
    rule = FedRC(num_clusters=1)
    losses = t([[0.3], [5.0], [1000.0], [0.0]])
    labels = torch.tensor([1, 0, 1, 1])
    log_c = label_statistics(torch.zeros(0, 2, 1, dtype=F64)).log()
    report = rule.e_step(losses, labels, ctx([1.0], 2, num_samples=4), log_c)
    assert torch.equal(report.gamma, torch.ones(4, 1, dtype=F64))
    assert_close(report.omega, t([1.0]), **TIGHT)
    assert_close(report.label_sums, t([[1.0], [3.0]]), **TIGHT)  # label counts
    plan = rule.local_plan(report, ctx([1.0], 2, num_samples=4))
    assert rule.contributions(report, plan, ctx([1.0], 2, num_samples=4)) == [Contribution(0, 0, 4.0)]


def test_fedrc_aggregation_weights_are_client_size_for_every_cluster() -> None:
    rule = FedRC(num_clusters=3)
    context = ctx([0.5, 0.3, 0.2], 2, num_samples=7)
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


def test_iterate_mixture_boundary_optimum_meets_tolerance() -> None:
    # The optimum is on the boundary, ω = [0, 1]; near it EM shrinks ω_0 by the factor
    # mean_j L_j0 / L_j1 per step (L_jk = e^{−f_jk} / C_{y_j,k}), which is 0.98510 here.
    losses = [[0.3, 1.1], [2.0, 0.4], [0.9, 0.8]]
    labels = [0, 1, 1]
    ratios = [
        math.exp(-f[0]) / C_STATS[y][0] / (math.exp(-f[1]) / C_STATS[y][1])
        for f, y in zip(losses, labels, strict=True)
    ]
    rate = sum(ratios) / 3
    assert rate == pytest.approx(0.9851049494084619, abs=1e-12)
    omega = iterate_mixture(t(losses), torch.tensor(labels), t(C_STATS).log())
    mapped = fixed_point_map(omega.tolist(), losses, labels, C_STATS)
    # The documented contract: iterate until ω changes by less than ``tolerance`` (1e-6).
    assert max(abs(a - b) for a, b in zip(mapped, omega.tolist(), strict=True)) < 1e-6


def test_iterate_mixture_warns_when_it_hits_the_iteration_cap() -> None:
    losses, labels = [[0.3, 1.1], [2.0, 0.4], [0.9, 0.8]], [0, 1, 1]
    with pytest.warns(RuntimeWarning, match="did not converge in 10 iterations"):
        iterate_mixture(
            t(losses), torch.tensor(labels), t(C_STATS).log(), max_iterations=10, accelerate=False
        )
    with pytest.warns(RuntimeWarning, match="did not converge in 1 iterations"):
        iterate_mixture(t(losses), torch.tensor(labels), t(C_STATS).log(), max_iterations=1)


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
    fedrc = rule.e_step(losses, labels, ctx(omega, 3, 4), stats.log())
    fedem = rule.e_step(losses, labels, ctx(omega, 3, 4), None)
    assert_close(fedrc.gamma, fedem.gamma, **TIGHT)
    assert_close(fedrc.omega, fedem.omega, **TIGHT)
    assert_close(fedrc.label_sums, fedem.label_sums, **TIGHT)


# --- server aggregation -----------------------------------------------------------------------------


def test_weighted_update_by_hand() -> None:
    reference = [t([1.0, 2.0], torch.float32), t([[0.5]], torch.float32)]
    client_a = [t([3.0, 2.0], torch.float32), t([[1.5]], torch.float32)]  # Δ = [2, 0], [[1]]
    client_b = [t([1.0, 6.0], torch.float32), t([[-0.5]], torch.float32)]  # Δ = [0, 4], [[-1]]
    acc = [torch.zeros(2, dtype=F64), torch.zeros(1, 1, dtype=F64)]
    accumulate_delta(acc, client_a, reference, 3.0)
    accumulate_delta(acc, client_b, reference, 1.0)
    assert acc[0].dtype == F64
    assert torch.equal(acc[0], t([6.0, 4.0]))  # 3·[2, 0] + 1·[0, 4]
    assert torch.equal(acc[1], t([[2.0]]))  # 3·1 + 1·(−1)
    # θ + 0.5 · Σ w Δ / 4 = [1, 2] + 0.5·[1.5, 1] , 0.5 + 0.5·0.5
    assert apply_weighted_update(reference, acc, weight_sum=4.0, server_lr=0.5) is True
    assert reference[0].dtype == torch.float32
    assert torch.equal(reference[0], t([1.75, 2.5], torch.float32))
    assert torch.equal(reference[1], t([[0.75]], torch.float32))
    # clients' tensors are not touched
    assert torch.equal(client_a[0], t([3.0, 2.0], torch.float32))


def test_weighted_update_default_server_lr_is_weighted_mean() -> None:
    reference = [t([0.0, 10.0], torch.float32)]
    acc = [torch.zeros(2, dtype=F64)]
    accumulate_delta(acc, [t([4.0, 10.0], torch.float32)], reference, 1.0)
    accumulate_delta(acc, [t([0.0, 14.0], torch.float32)], reference, 3.0)
    assert apply_weighted_update(reference, acc, 4.0)
    assert torch.equal(reference[0], t([1.0, 13.0], torch.float32))  # (4·1 + 0·3)/4, 10 + (0 + 4·3)/4


@pytest.mark.parametrize("weight_sum", [0.0, -1.0])
def test_zero_weight_leaves_model_unchanged(weight_sum: float) -> None:
    reference = [t([1.0, 2.0], torch.float32)]
    acc = [t([5.0, 5.0])]
    assert apply_weighted_update(reference, acc, weight_sum, server_lr=1.0) is False
    assert torch.equal(reference[0], t([1.0, 2.0], torch.float32))


def test_float64_accumulation_is_order_independent() -> None:
    gen = torch.Generator().manual_seed(1234)
    shapes = [(257,), (3, 5)]
    reference = [torch.randn(s, generator=gen) for s in shapes]
    clients = []
    for i in range(50):
        scale = 10.0 ** (i % 7 - 3)
        local = [r + scale * torch.randn(r.shape, generator=gen) for r in reference]
        clients.append((local, float(torch.randint(1, 500, (), generator=gen))))
    weight_sum = sum(w for _, w in clients)
    order = torch.randperm(50, generator=gen).tolist()

    def aggregate(indices, acc_dtype):
        acc = [torch.zeros(s, dtype=acc_dtype) for s in shapes]
        for i in indices:
            accumulate_delta(acc, clients[i][0], reference, clients[i][1])
        theta = [r.clone() for r in reference]
        apply_weighted_update(theta, acc, weight_sum, server_lr=0.5)
        return theta

    forward, shuffled = aggregate(range(50), F64), aggregate(order, F64)
    backward = aggregate(reversed(range(50)), F64)
    for a, b, c in zip(forward, shuffled, backward, strict=True):
        assert a.dtype == torch.float32
        assert torch.equal(a, b)
        assert torch.equal(a, c)
    # The check has teeth: a float32 accumulator does depend on the order.
    f32_forward, f32_shuffled = aggregate(range(50), torch.float32), aggregate(order, torch.float32)
    assert not all(torch.equal(a, b) for a, b in zip(f32_forward, f32_shuffled, strict=True))


# --- client state -------------------------------------------------------------------------------------


def test_client_state_initial() -> None:
    state = ClientState.initial(num_clients=4, num_classes=3, num_clusters=2)
    assert state.num_clients == 4 and state.num_clusters == 2
    assert state.omega.dtype == F64 and state.label_sums.dtype == F64 and state.seen.dtype == torch.bool
    assert torch.equal(state.omega, torch.full((4, 2), 0.5, dtype=F64))
    assert torch.equal(state.label_sums, torch.zeros(4, 3, 2, dtype=F64))
    assert not state.seen.any()
    assert_close(ClientState.initial(2, 2, 3).omega, torch.full((2, 3), 1 / 3, dtype=F64), **TIGHT)


def test_client_state_record_touches_only_given_rows() -> None:
    state = ClientState.initial(num_clients=4, num_classes=2, num_clusters=2)
    omega = t([[0.9, 0.1], [0.2, 0.8]], torch.float32)
    sums = t([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]], torch.float32)
    state.record(torch.tensor([1, 3]), omega, sums)
    assert state.omega.dtype == F64 and state.label_sums.dtype == F64
    assert torch.equal(state.seen, torch.tensor([False, True, False, True]))
    assert torch.equal(state.omega[[0, 2]], torch.full((2, 2), 0.5, dtype=F64))
    assert torch.equal(state.omega[[1, 3]], omega.double())
    assert torch.equal(state.label_sums[[0, 2]], torch.zeros(2, 2, 2, dtype=F64))
    assert torch.equal(state.label_sums[[1, 3]], sums.double())


def test_client_state_round_trip() -> None:
    state = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2)
    state.record(torch.tensor([2]), t([[0.25, 0.75]]), t([[[1.0, 0.0], [0.5, 2.0]]]))
    saved = state.state_dict()
    assert set(saved) == {"omega", "label_sums", "seen", "active"}
    state.record(torch.tensor([0]), t([[0.1, 0.9]]), t([[[9.0, 9.0], [9.0, 9.0]]]))  # after saving
    assert torch.equal(saved["seen"], torch.tensor([False, False, True]))  # the dict holds copies

    restored = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2)
    restored.load_state_dict(saved)
    assert torch.equal(restored.omega, t([[0.5, 0.5], [0.5, 0.5], [0.25, 0.75]]))
    assert torch.equal(restored.label_sums[2], t([[1.0, 0.0], [0.5, 2.0]]))
    assert torch.equal(restored.label_sums[:2], torch.zeros(2, 2, 2, dtype=F64))
    assert torch.equal(restored.seen, torch.tensor([False, False, True]))
    for name in ("omega", "label_sums", "seen"):
        assert torch.equal(restored.state_dict()[name], saved[name])


@pytest.mark.parametrize(("clients", "classes", "clusters"), [(4, 2, 2), (3, 5, 2), (3, 2, 3)])
def test_client_state_shape_mismatch(clients: int, classes: int, clusters: int) -> None:
    saved = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2).state_dict()
    other = ClientState.initial(clients, classes, clusters)
    with pytest.raises(ValueError, match="resume with the same datamodule"):
        other.load_state_dict(saved)


def test_accelerated_unseen_client_iteration_equals_the_slow_one_without_hitting_the_cap() -> None:
    import warnings

    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        n, k = 50 + 10 * trial, 2 + trial % 4
        # Near one-hot optima (one model much better) are where plain EM crawls.
        losses = torch.rand(n, k, generator=generator, dtype=F64) * 3
        losses[:, trial % k] -= 1.5 * (trial % 3)
        labels = torch.randint(0, 3, (n,), generator=generator)
        stats = torch.rand(3, k, generator=generator, dtype=F64).add(0.1).log() if trial % 2 else None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the accelerated scheme must converge within the cap
            fast = iterate_mixture(losses, labels, stats)
        slow = iterate_mixture(
            losses, labels, stats, accelerate=False, max_iterations=400_000, tolerance=1e-13
        )
        assert_close(fast, slow, rtol=0, atol=1e-6)
        assert float(fast.sum()) == pytest.approx(1.0, abs=1e-12) and bool((fast >= 0).all())
