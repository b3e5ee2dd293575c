"""algorithms/mixture.py: the E-step math (responsibilities, label statistics, iterated mixtures for
unseen clients, hard weights) against numbers computed by hand with plain Python ``math``."""

import math
import warnings

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.mixture import (
    FLAT_TOLERANCE,
    LABEL_STATS_FLOOR,
    fit_mixture,
    hard_weights,
    iterate_mixture,
    label_statistics,
    label_sums,
    likelihood_gap,
    mixture_from_responsibilities,
    mixture_probabilities,
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
    TIGHT,
    fixed_point_map,
    t,
)


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


def test_accelerated_unseen_client_iteration_equals_the_slow_one_without_hitting_the_cap() -> None:

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
            losses, labels, stats, accelerate=False, max_iterations=400_000, tolerance=1e-13, flat_tolerance=0
        )
        assert_close(fast, slow, rtol=0, atol=1e-6)
        assert float(fast.sum()) == pytest.approx(1.0, abs=1e-12) and bool((fast >= 0).all())


def test_nearly_equal_cluster_losses_stop_far_below_the_cap_within_the_flat_tolerance() -> None:
    """Losses that differ little across the clusters (early training): a flat likelihood, where
    the E-step used to run into its 5,000-iteration cap. It stops at a certified optimum, or
    once the client's total log-likelihood is certified within ``FLAT_TOLERANCE`` nats of it."""
    generator = torch.Generator().manual_seed(0)
    for spread in (1e-2, 3e-3, 1e-4):
        for _ in range(10):
            base = torch.rand(120, 1, generator=generator, dtype=F64) * 2 + 1.5
            losses = base + spread * torch.randn(120, 3, generator=generator, dtype=F64)
            labels = torch.randint(0, 10, (120,), generator=generator)
            fit = fit_mixture(losses, labels)
            assert fit.iterations <= 100, (spread, fit.iterations)  # 50x below the cap
            gap = likelihood_gap(-losses, fit.omega)
            assert gap <= 1e-12 or 120 * gap <= FLAT_TOLERANCE
            assert float(fit.omega.sum()) == pytest.approx(1.0, abs=1e-12) and bool((fit.omega >= 0).all())


def ridge_losses(scale: float, noise: float, seed: int, n: int = 1600) -> tuple[torch.Tensor, torch.Tensor]:
    """Three models, the third's likelihood nearly (0.3, 0.7) of the first two's (log-likelihood
    noise ``noise``): the likelihood of ω is nearly flat along a ridge, where the E-step crawls."""
    generator = torch.Generator().manual_seed(seed)
    two = scale * torch.randn(n, 2, generator=generator, dtype=F64)
    third = torch.logsumexp(two + t([0.3, 0.7]).log(), dim=1, keepdim=True)
    third = third + noise * torch.randn(n, 1, generator=generator, dtype=F64)
    return 2.3 - torch.cat([two, third], dim=1), torch.randint(0, 10, (n,), generator=generator)


@pytest.mark.parametrize(
    ("scale", "noise", "seed"), [(1.0, 1e-3, 0), (1.0, 1e-2, 0), (0.1, 1e-4, 1), (0.1, 1e-3, 0)]
)
def test_a_flat_ridge_stops_early_within_the_flat_tolerance(scale, noise, seed) -> None:
    """Before the flat stop these took 1,613 to 5,000 iterations (the cap), 3 to 6 s each; the
    data cannot tell the ridge's points apart."""
    losses, labels = ridge_losses(scale, noise, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "did not converge"
        fit = fit_mixture(losses, labels)
    assert fit.iterations <= 50, fit.iterations
    assert labels.numel() * likelihood_gap(-losses, fit.omega) <= FLAT_TOLERANCE
    # Without the flat stop the same problem crawls on.
    with pytest.warns(RuntimeWarning, match="did not converge in 200 iterations"):
        fit_mixture(losses, labels, flat_tolerance=0, max_iterations=200)


def test_identical_cluster_likelihoods_leave_omega_uniform_at_once() -> None:
    losses = torch.rand(40, 1, generator=torch.Generator().manual_seed(0), dtype=F64).expand(40, 4)
    fit = fit_mixture(losses, torch.zeros(40, dtype=torch.long))
    assert fit.iterations == 0
    assert torch.equal(fit.omega, torch.full((4,), 0.25, dtype=F64))


def test_distinct_clusters_are_solved_exactly_as_by_hand() -> None:
    """Two clusters, two kinds of sample: n_a rows with likelihoods (a0, a1) and n_b with (b0, b1).
    Setting dL/dω = n_a d_a / (ω d_a + a1) + n_b d_b / (ω d_b + b1) = 0 (d = L_0 − L_1) gives
    ω_0 = −(n_a d_a b1 + n_b d_b a1) / ((n_a + n_b) d_a d_b). The flat stop must not cut this short."""
    n_a, n_b = 700, 300
    f_a, f_b = (0.2, 1.4), (1.9, 0.5)  # per-sample losses of the two clusters
    (a0, a1), (b0, b1) = ((math.exp(-f) for f in pair) for pair in (f_a, f_b))
    d_a, d_b = a0 - a1, b0 - b1
    expected = -(n_a * d_a * b1 + n_b * d_b * a1) / ((n_a + n_b) * d_a * d_b)
    assert expected == pytest.approx(0.7998137443229204, abs=1e-15)
    losses = t([list(f_a)] * n_a + [list(f_b)] * n_b)
    fit = fit_mixture(losses, torch.zeros(n_a + n_b, dtype=torch.long))
    assert fit.gap <= 1e-12  # stopped by the certificate, not by the flat rule
    assert_close(fit.omega, t([expected, 1 - expected]), rtol=0, atol=1e-12)
