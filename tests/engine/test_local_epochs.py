"""local_epochs=E means E passes over a client's data in shuffled minibatches with a partial last
batch (or none, drop_last), reshuffled every pass, on both executors."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.client import minibatch_order
from lightning_fedcluster.engine.schedule import epoch_batch, local_steps_per_client
from lightning_fedcluster.engine.vectorized import epoch_engine_batches
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "batch"), [(10, 4), (12, 4), (7, 32), (33, 8)])
def test_an_epoch_covers_every_sample_once_in_ceil_or_floor_n_over_b_batches(n, batch, drop_last):
    if drop_last and n < batch:
        with pytest.raises(ValueError, match="drop_last=True drops every batch of client 0"):
            local_steps_per_client(torch.tensor([n]), batch, None, 1, drop_last)
        return
    steps = int(local_steps_per_client(torch.tensor([n]), batch, None, 2, drop_last))
    expected = 2 * (n // batch if drop_last else -(-n // batch))
    assert steps == expected
    seen: dict[int, list[int]] = {0: [], 1: []}
    for step in range(steps):
        epoch, start, stop = epoch_batch(step, n, batch, drop_last)
        order = minibatch_order(0, 3, 5, n, epoch)
        seen[epoch] += order[start:stop].tolist()
        assert stop - start == batch or (not drop_last and stop == n)
    for epoch in (0, 1):
        covered = sorted(seen[epoch])
        assert covered == (sorted(minibatch_order(0, 3, 5, n, epoch)[: (n // batch) * batch].tolist())
                           if drop_last else list(range(n)))
    assert minibatch_order(0, 3, 5, n, 0).tolist() != minibatch_order(0, 3, 5, n, 1).tolist() or n < 3


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


@pytest.mark.parametrize("drop_last", [False, True])
def test_loop_and_vectorised_executors_agree_with_local_epochs(drop_last):
    results = {}
    for executor in ("loop", "vectorized"):
        strategy = lf.FedRCStrategy(
            2, local_epochs=2, drop_last=drop_last, clients_per_round=4, executor=executor
        )
        dm = DigitsFederated(num_clients=6, concepts=2, batch_size=16, seed=0)
        trainer = make_trainer(strategy, max_epochs=2)
        trainer.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=dm)
        assert trainer.lightning_module.executor == executor
        steps = strategy.round_schedule(dm).steps_per_client
        per_pass = dm.train_sizes // 16 if drop_last else (dm.train_sizes + 15) // 16
        assert torch.equal(steps, 2 * per_pass)
        results[executor] = trainer.lightning_module.state_dict()
    for name, value in results["loop"].items():
        torch.testing.assert_close(results["vectorized"][name], value, rtol=1e-4, atol=1e-5)


def test_drop_last_needs_local_epochs():
    with pytest.raises(ValueError, match="drop_last applies to local_epochs"):
        lf.FedRCStrategy(2, local_steps=3, drop_last=True)
