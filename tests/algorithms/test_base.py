"""algorithms/base.py: the E-step of many clients at once (batched by ``SoftMixture``, client by client
by default) equals the client-by-client E-step."""

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms import IFCA
from lightning_fedcluster.algorithms.base import Algorithm, SoftMixture
from lightning_fedcluster.algorithms.fedrc import FedRC
from tests.helpers.algorithms import F64, TIGHT, ctx

# --- several clients' E-step at once (the vectorised executor) ---------------------------------------


@pytest.mark.parametrize(
    "make_rule",
    [
        lambda: FedRC(3),
        lambda: FedRC(3, use_label_stats=False),
        lambda: FedRC(3, adam_gamma=True, label_noise_std=0.3),
        lambda: IFCA(3),
        lambda: Algorithm(3),
        lambda: SoftMixture(3),
    ],
    ids=["fedrc", "fedem", "fedrc_adam_noise", "ifca", "base", "soft_mixture"],
)
def test_e_step_of_many_clients_equals_the_client_by_client_e_step(make_rule):
    generator = torch.Generator().manual_seed(4)
    sizes = [5, 1, 7, 3]
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    losses = 3 * torch.rand(int(offsets[-1]), 3, generator=generator, dtype=F64)
    labels = torch.randint(0, 4, (int(offsets[-1]),), generator=generator)
    log_stats = torch.rand(4, 3, generator=generator, dtype=F64).log()
    active = [True, False, True]
    omegas = torch.rand(len(sizes), 3, generator=generator, dtype=F64).softmax(1)

    def contexts():
        return [
            ctx(omegas[c], num_classes=4, num_samples=n, client=c, active=active, seed=c)
            for c, n in enumerate(sizes)
        ]

    rule = make_rule()
    many = rule.e_step_many(losses, labels, offsets, contexts(), log_stats)
    one_by_one = [
        rule.e_step(losses[a:b], labels[a:b], context, log_stats)
        for a, b, context in zip(offsets[:-1], offsets[1:], contexts(), strict=True)
    ]
    assert len(many) == len(sizes)
    for batched, single in zip(many, one_by_one, strict=True):
        assert_close(batched.gamma, single.gamma, **TIGHT)
        assert_close(batched.omega, single.omega, **TIGHT)
        assert_close(batched.label_sums, single.label_sums, **TIGHT)
        assert float(batched.omega[1]) == 0.0  # the removed cluster gets nothing
