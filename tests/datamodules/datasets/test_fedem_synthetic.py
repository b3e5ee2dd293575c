"""The FedEM synthetic generator draws from the paper's stated distributions (fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules.datasets.fedem_synthetic import (
    FedEMSynthetic,
    generate_mixture,
    sample_client_sizes,
)


@pytest.fixture(scope="module")
def paper_task() -> FedEMSynthetic:
    return FedEMSynthetic(seed=0, global_test_size=200)


def test_shapes_splits_and_metadata(paper_task):
    dm = paper_task
    assert dm.num_clients == 300 and dm.num_classes == 2 and dm.batch_size == 128
    assert dm.train_x.shape[1:] == (150,) and dm.train_x.dtype == torch.float32
    assert dm.theta.shape == (3, 150) and dm.mixture_weights.shape == (300, 3)
    assert float(dm.train_x.abs().max()) <= 1.0
    assert set(dm.train_y.unique().tolist()) == {0, 1}
    held_out = dm.val_sizes + dm.test_sizes  # the held-out rows, half validation, half test
    total = dm.train_sizes + held_out
    assert torch.equal(held_out, torch.round(0.2 * total.double()).long())
    assert torch.equal(dm.metadata.concept, dm.mixture_weights.argmax(1))
    assert dm.num_global_clients == 3 and torch.equal(dm.metadata.global_concept, torch.arange(3))
    assert dm.train_z.shape == dm.train_y.shape and dm.test_z.shape == dm.test_y.shape


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = (
        generate_mixture(20, dim=4, seed=1),
        generate_mixture(20, dim=4, seed=1),
        generate_mixture(20, dim=4, seed=2),
    )
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.offsets, b.offsets)
    assert not torch.equal(a.theta, c.theta)


def test_client_sizes_follow_the_capped_lognormal_law():
    sizes = sample_client_sizes(np.random.default_rng(0), 20000)
    assert sizes.min() >= 50 and sizes.max() == 1000

    # m = n - 50 = floor(L), L ~ LogNormal(4, 2), capped at 950: P(m < q) = P(L < q) = Φ((ln q - 4) / 2).
    def normal_cdf(v: float) -> float:
        return 0.5 * math.erfc(-v / math.sqrt(2))

    m = sizes - 50
    for q in (2, 7, 55, 150, 403, 900):
        assert (m < q).mean() == pytest.approx(normal_cdf((math.log(q) - 4) / 2), abs=0.012), q
    assert (sizes == 1000).mean() == pytest.approx(1 - normal_cdf((math.log(950) - 4) / 2), abs=0.008)


def test_mixture_weights_are_dirichlet_and_components_follow_them():
    mix = generate_mixture(3000, dim=2, alpha=0.4, seed=3)
    pi = mix.mixture_weights
    assert torch.allclose(pi.sum(1), torch.ones(3000, dtype=torch.float64))
    # Dir(0.4, 0.4, 0.4): mean 1/3, variance a(a0 - a) / (a0² (a0 + 1)) = 0.101.
    torch.testing.assert_close(pi.mean(0), torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.02, rtol=0)
    torch.testing.assert_close(
        pi.var(0), torch.full((3,), 0.4 * 0.8 / (1.2**2 * 2.2), dtype=torch.float64), atol=0.01, rtol=0
    )
    # Latent components of each client ~ Categorical(π_t): counts match n_t π_t in aggregate.
    owner = torch.repeat_interleave(torch.arange(3000), mix.offsets.diff())
    counts = torch.zeros(3000, 3, dtype=torch.float64).index_put_(
        (owner, mix.z), torch.ones(owner.numel(), dtype=torch.float64), accumulate=True
    )
    expected = mix.offsets.diff().double().unsqueeze(1) * pi
    variance = (expected * (1 - pi)).sum(0)
    assert torch.all((counts.sum(0) - expected.sum(0)).abs() < 5 * variance.sqrt())
    # A client with a one-component π only ever draws that component.
    dominant = pi.max(1).values > 0.999
    assert dominant.any()
    rows = torch.isin(owner, dominant.nonzero().flatten())
    assert torch.equal(mix.z[rows], pi.argmax(1)[owner[rows]])


def test_every_label_comes_from_its_own_component():
    """y ~ Bernoulli(sigmoid(<x, θ_z> + ε)); no label is overwritten by another component."""
    mix = generate_mixture(300, dim=150, noise_std=0.1, seed=4)
    x, y, z = mix.x.double(), mix.y, mix.z
    scores = x @ mix.theta.T  # [N, M]
    own = scores.gather(1, z.unsqueeze(1)).squeeze(1)
    assert y.double().mean() == pytest.approx(0.5, abs=0.03)
    # Calibration: within bins of the own-component logit, P(y = 1) matches the sigmoid.
    edges = torch.tensor([-math.inf, -4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0, math.inf], dtype=torch.float64)
    bins = torch.bucketize(own, edges) - 1
    for b in range(len(edges) - 1):
        chosen = bins == b
        if int(chosen.sum()) < 500:
            continue
        expected = torch.sigmoid(own[chosen]).mean()
        assert y[chosen].double().mean() == pytest.approx(float(expected), abs=0.03)
    # Sign agreement with the own component's logit is high, with any other component's at chance.
    for m in range(3):
        rows = z == m
        assert ((scores[rows, m] > 0).long() == y[rows]).double().mean() > 0.8
        for other in range(3):
            if other != m:
                assert ((scores[rows, other] > 0).long() == y[rows]).double().mean() < 0.6


def test_threshold_rule_rounds_the_sigmoid():
    mix = generate_mixture(30, dim=10, noise_std=0.0, label_rule="threshold", seed=5)
    own = (mix.x.double() * mix.theta[mix.z]).sum(1)
    assert torch.equal(mix.y, (own > 0).long())


def test_global_clients_are_pure_components(paper_task):
    for g in range(3):
        x, y = paper_task.global_split(g)
        scores = x.double() @ paper_task.theta.T
        agreement = ((scores > 0).long() == y.unsqueeze(1)).double().mean(0)
        assert int(agreement.argmax()) == g and agreement[g] > 0.8


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 0.0},
        {"num_clients": 0},
        {"noise_std": -1.0},
        {"label_rule": "round"},
        {"min_samples": 10, "max_samples": 5},
    ],
)
def test_bad_arguments_are_rejected(kwargs):
    with pytest.raises(ValueError):
        generate_mixture(**{"num_clients": 5, "dim": 3, **kwargs})
