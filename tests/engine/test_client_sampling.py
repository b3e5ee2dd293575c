"""engine/client_sampling.py: the round schedule (client sampling, work assignment, local steps, epoch
batches)."""

import math

import pytest
import torch

from lightning_fedcluster.engine.client import minibatch_order
from lightning_fedcluster.engine.client_sampling import (
    RoundSchedule,
    epoch_batch,
    local_steps_per_client,
    schedule_for,
)


def schedule(num_clients: int = 30, clients_per_round: int = 10, seed: int = 0, steps=None) -> RoundSchedule:
    steps = torch.full((num_clients,), 5) if steps is None else torch.as_tensor(steps)
    return RoundSchedule(num_clients, clients_per_round, steps, seed=seed)


# --- client sampling ---------------------------------------------------------------------------


def test_round_clients_sorted_unique_right_size() -> None:
    sched = schedule(num_clients=30, clients_per_round=10)
    for round_index in range(20):
        clients = sched.clients(round_index)
        assert clients.dtype == torch.int64
        assert clients.shape == (10,)
        assert torch.equal(clients, clients.sort().values)
        assert len(set(clients.tolist())) == 10
        assert 0 <= int(clients.min()) and int(clients.max()) < 30


def test_round_clients_deterministic_per_seed_and_round() -> None:
    a, b = schedule(seed=3), schedule(seed=3)
    for round_index in (0, 1, 7, 299):
        assert torch.equal(a.clients(round_index), b.clients(round_index))
    rounds = [tuple(a.clients(r).tolist()) for r in range(20)]
    assert len(set(rounds)) == 20  # different across rounds
    assert a.clients(0).tolist() != a.clients(1).tolist()
    other_seed = schedule(seed=4)
    assert any(not torch.equal(a.clients(r), other_seed.clients(r)) for r in range(5))


def test_all_clients_when_clients_per_round_is_num_clients() -> None:
    sched = schedule(num_clients=7, clients_per_round=7, seed=11)
    for round_index in range(3):
        assert torch.equal(sched.clients(round_index), torch.arange(7))


def test_sampling_is_roughly_uniform_over_rounds() -> None:
    num_clients, per_round, rounds = 20, 5, 300
    sched = schedule(num_clients=num_clients, clients_per_round=per_round)
    counts = torch.zeros(num_clients, dtype=torch.int64)
    for round_index in range(rounds):
        counts[sched.clients(round_index)] += 1
    assert int(counts.sum()) == per_round * rounds
    # Each client: Binomial(300, 1/4), mean 75, sd sqrt(300 · 1/4 · 3/4) = 7.5; allow ±5 sd.
    expected, sd = rounds * per_round / num_clients, math.sqrt(rounds * 0.25 * 0.75)
    assert expected == 75.0 and sd == 7.5
    assert int(counts.min()) >= expected - 5 * sd
    assert int(counts.max()) <= expected + 5 * sd


@pytest.mark.parametrize("clients_per_round", [0, -1, 31])
def test_invalid_clients_per_round(clients_per_round: int) -> None:
    with pytest.raises(ValueError, match="clients_per_round"):
        schedule(num_clients=30, clients_per_round=clients_per_round)


# --- local steps ---------------------------------------------------------------------------------


def test_local_steps_fixed() -> None:
    sizes = torch.tensor([10, 33, 64, 1000])
    steps = local_steps_per_client(sizes, batch_size=32, local_steps=5, local_epochs=None)
    assert torch.equal(steps, torch.tensor([5, 5, 5, 5]))
    # a fixed step count wins over local_epochs
    steps = local_steps_per_client(sizes, batch_size=32, local_steps=3, local_epochs=2)
    assert torch.equal(steps, torch.tensor([3, 3, 3, 3]))


def test_local_steps_from_epochs_is_ceil_n_over_b_times_e() -> None:
    sizes = torch.tensor([1, 10, 32, 33, 64, 65])
    # ceil(N / 32) = 1, 1, 1, 2, 2, 3
    steps = local_steps_per_client(sizes, batch_size=32, local_steps=None, local_epochs=2)
    assert torch.equal(steps, torch.tensor([2, 2, 2, 4, 4, 6]))
    steps = local_steps_per_client(sizes, batch_size=10, local_steps=None, local_epochs=1)
    assert torch.equal(steps, torch.tensor([1, 1, 4, 4, 7, 7]))


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
        assert covered == (
            sorted(minibatch_order(0, 3, 5, n, epoch)[: (n // batch) * batch].tolist())
            if drop_last
            else list(range(n))
        )
    assert minibatch_order(0, 3, 5, n, 0).tolist() != minibatch_order(0, 3, 5, n, 1).tolist() or n < 3


class _Data:
    """A datamodule's view for the schedule: client sizes, batch size, count."""

    train_sizes = torch.tensor([10, 3, 7])
    batch_size = 4
    num_clients = 3


class _Uniform:
    class capabilities:  # noqa: N801 - the rule's capability flags, as Capabilities exposes them
        server_selection = False


class _PicksLast:
    """A server-selecting rule that reads the client store when the round comes."""

    class capabilities:  # noqa: N801
        server_selection = True

    def max_clients_per_round(self, num_clients: int) -> int:
        return 2

    def round_membership(self, round_index, state, train_sizes, seed) -> torch.Tensor:
        membership = torch.zeros(len(train_sizes), 1, dtype=torch.bool)
        membership[state[round_index % len(state)]] = True
        return membership


def test_schedule_for_counts_epochs_and_samples_uniformly() -> None:
    schedule = schedule_for(_Uniform(), _Data(), 2, None, 2, False, 5, lambda: None)
    assert schedule.steps_per_client.tolist() == [6, 2, 4]  # 2 passes of ceil(N/4) batches
    assert schedule.clients_per_round == 2 and schedule.selector is None
    assert (
        schedule.clients(0).tolist()
        == schedule_for(_Uniform(), _Data(), 2, None, 2, False, 5, lambda: None).clients(0).tolist()
    )
    assert schedule_for(_Uniform(), _Data(), None, 3, None, False, 0, lambda: None).clients_per_round == 3


def test_schedule_for_lets_a_selecting_rule_read_the_store_at_each_round() -> None:
    store = [[2], [0]]
    schedule = schedule_for(_PicksLast(), _Data(), None, 1, None, False, 0, lambda: store)
    assert schedule.clients_per_round == 2
    assert schedule.clients(0).tolist() == [2] and schedule.clients(1).tolist() == [0]
    store[0] = [1]  # read when the round comes, not when the schedule was built
    assert schedule.clients(2).tolist() == [1]
