"""The vectorised executor (torch.func) equals the plain per-client, per-cluster loop."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_fedcluster.algorithms.mixture import (
    label_sums,
    mixture_from_responsibilities,
    responsibilities,
)
from lightning_fedcluster.engine.batched_steps import (
    SGDConfig,
    batched_e_step,
    cluster_losses,
    engine_batches,
    epoch_engine_batches,
    expand_clients,
    functional_template,
    local_sgd,
    pad_clients,
    stack_models,
)
from lightning_fedcluster.engine.client import minibatch_order
from lightning_fedcluster.engine.client_sampling import epoch_batch, local_steps_per_client

SIZES = [5, 17, 40, 33, 1]
BATCH = 16


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread avoids OpenMP hand-offs that crawl on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _linear() -> nn.Module:
    return nn.Linear(6, 3)


class _TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(2 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.max_pool2d(F.relu(self.conv(x.view(-1, 1, 6, 1).expand(-1, 1, 6, 6))), 2).flatten(1))


def _clusters(factory, k: int = 3) -> list[nn.Module]:
    torch.manual_seed(0)
    return [factory() for _ in range(k)]


def _round_data(k: int = 3):
    """Ragged clients; client 1 never trains cluster 2 (zero weight), as the engine skips it."""
    generator = torch.Generator().manual_seed(1)
    n = sum(SIZES)
    x = torch.randn(n, 6, generator=generator)
    y = torch.randint(0, 3, (n,), generator=generator)
    weights = torch.softmax(torch.randn(n, k, generator=generator), dim=1)
    offsets = torch.tensor([0, *SIZES]).cumsum(0)
    weights[int(offsets[1]) : int(offsets[2]), 2] = 0.0
    orders = [torch.randperm(s, generator=generator) for s in SIZES]
    steps = torch.tensor([2 * math.ceil(s / BATCH) for s in SIZES])  # two local epochs
    return x, y, weights, offsets, orders, steps


def _loop(models, x, y, weights, offsets, orders, steps, options):
    """Reference: each client trains its own copies with torch.optim.SGD, one backward of the
    sum over the clusters it trains, loss (1/B) Σ_j w_jk f_jk, batches as the engine draws them."""
    results = []
    for c in range(len(SIZES)):
        start, stop = int(offsets[c]), int(offsets[c + 1])
        xc, yc, wc = x[start:stop], y[start:stop], weights[start:stop]
        local = [copy.deepcopy(m) for m in models]
        trained = [k for k in range(len(models)) if float(wc[:, k].sum()) > 0]
        optimizer = torch.optim.SGD([p for m in local for p in m.parameters()], **options)
        n = stop - start
        size = min(BATCH, n)
        for step in range(int(steps[c])):
            index = orders[c][(step * size + torch.arange(size)) % n]
            optimizer.zero_grad()
            xb, yb = xc[index], yc[index]
            total = sum(
                (wc[index, k] * F.cross_entropy(local[k](xb), yb, reduction="none")).sum() / size
                for k in trained
            )
            total.backward()
            optimizer.step()
        results.append(local)
    return results


OPTIONS = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
    {"lr": 0.05, "momentum": 0.5, "nesterov": True},
    {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 1e-2},
]


@pytest.mark.parametrize("factory", [_mlp, _linear, _TinyCNN], ids=["mlp", "linear", "cnn"])
@pytest.mark.parametrize("options", OPTIONS, ids=["sgd", "momentum+wd", "nesterov", "dampening+wd"])
def test_local_sgd_matches_the_per_client_loop(factory, options):
    models = _clusters(factory)
    x, y, weights, offsets, orders, steps = _round_data()
    expected = _loop(models, x, y, weights, offsets, orders, steps, options)

    params, buffers = stack_models(models)
    config = SGDConfig.from_optimizer(torch.optim.SGD(models[0].parameters(), **options))
    batches = engine_batches(x, y, weights, offsets, orders, steps, BATCH)
    start = expand_clients(params, len(SIZES))
    got = local_sgd(functional_template(models[0]), start, buffers, batches, config)

    for c, local in enumerate(expected):
        for k, model in enumerate(local):
            for name, p in model.named_parameters():
                torch.testing.assert_close(got[name][c, k], p.detach(), rtol=1e-5, atol=1e-5)
    # The untrained pair (client 1, cluster 2) kept the global weights exactly.
    for name, p in params.items():
        assert torch.equal(got[name][1, 2], p[2])


def test_local_sgd_does_not_modify_its_inputs():
    models = _clusters(_mlp)
    params, buffers = stack_models(models)
    start = expand_clients(params, len(SIZES))
    before = {n: p.clone() for n, p in start.items()}
    x, y, weights, offsets, orders, steps = _round_data()
    local_sgd(
        functional_template(models[0]),
        start,
        buffers,
        engine_batches(x, y, weights, offsets, orders, steps, BATCH),
        SGDConfig(lr=0.1),
    )
    for name, p in start.items():
        assert torch.equal(p, before[name])


@pytest.mark.parametrize("factory", [_mlp, _linear, _TinyCNN], ids=["mlp", "linear", "cnn"])
def test_cluster_losses_match_each_model(factory):
    models = _clusters(factory)
    x, y, *_ = _round_data()
    params, buffers = stack_models(models)
    losses, outputs = cluster_losses(functional_template(models[0]), params, buffers, x, y, chunk_size=32)
    with torch.no_grad():
        for k, model in enumerate(models):
            logits = model(x)
            torch.testing.assert_close(outputs[k], logits, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(
                losses[:, k], F.cross_entropy(logits, y, reduction="none"), rtol=1e-5, atol=1e-6
            )
    none, _ = cluster_losses(functional_template(models[0]), params, buffers, x)
    assert none is None


@pytest.mark.parametrize("with_label_stats", [True, False], ids=["fedrc", "fedem"])
def test_batched_e_step_equals_the_per_client_e_step(with_label_stats):
    generator = torch.Generator().manual_seed(2)
    x, y, _, offsets, *_ = _round_data()
    losses = torch.rand(y.shape[0], 3, generator=generator, dtype=torch.float64) * 3
    log_omega = torch.log_softmax(torch.randn(len(SIZES), 3, generator=generator, dtype=torch.float64), 1)
    stats = torch.softmax(torch.randn(3, 3, generator=generator, dtype=torch.float64), 0).log()
    stats = stats if with_label_stats else None

    padded_losses, mask = pad_clients(losses, offsets)
    padded_labels, _ = pad_clients(y, offsets)
    gamma, omega, sums = batched_e_step(padded_losses, padded_labels, mask, log_omega, stats, 3)
    for c in range(len(SIZES)):
        start, stop = int(offsets[c]), int(offsets[c + 1])
        log_gamma = responsibilities(losses[start:stop], y[start:stop], log_omega[c], stats)
        n = stop - start
        torch.testing.assert_close(gamma[c, :n], log_gamma.exp())
        assert torch.all(gamma[c, n:] == 0)
        torch.testing.assert_close(omega[c], mixture_from_responsibilities(log_gamma).exp())
        torch.testing.assert_close(sums[c], label_sums(log_gamma.exp(), y[start:stop], 3))


def test_pad_clients_round_trip():
    values = torch.arange(12.0).view(6, 2)
    offsets = torch.tensor([0, 1, 4, 6])
    padded, mask = pad_clients(values, offsets, fill=-1)
    assert padded.shape == (3, 3, 2)
    assert mask.tolist() == [[True, False, False], [True, True, True], [True, True, False]]
    assert torch.equal(padded[mask], values)
    assert torch.all(padded[~mask] == -1)


def test_models_that_update_buffers_and_other_optimizers_are_refused():
    with pytest.raises(NotImplementedError, match="running statistics"):
        functional_template(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    functional_template(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).eval())  # eval mode is fine
    with pytest.raises(TypeError, match="SGD"):
        SGDConfig.from_optimizer(torch.optim.Adam(_linear().parameters()))


def test_the_vectorised_epoch_batches_are_the_loop_batches():
    sizes = torch.tensor([10, 7])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    x = torch.arange(17, dtype=torch.float32).unsqueeze(1)
    y = torch.zeros(17, dtype=torch.long)
    orders = [[minibatch_order(0, 0, c, int(n), e) for e in range(2)] for c, n in enumerate(sizes)]
    steps = local_steps_per_client(sizes, 4, None, 2)
    trained = torch.ones(2, 1, dtype=torch.bool)
    batches = list(epoch_engine_batches(x, y, torch.ones(17, 1), offsets, orders, steps, 4, False, trained))
    for c, n in enumerate(sizes.tolist()):
        for step in range(int(steps[c])):
            epoch, start, stop = epoch_batch(step, n, 4, False)
            expected = (orders[c][epoch][start:stop] + int(offsets[c])).float()
            batch = batches[step]
            got = batch.x[c, : stop - start, 0]
            assert torch.equal(got, expected) and int(batch.divisor[c]) == stop - start
            assert float(batch.weights[c, stop - start :].sum()) == 0.0  # padding carries no weight
