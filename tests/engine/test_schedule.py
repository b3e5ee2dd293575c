"""The round schedule (client sampling, work assignment, local steps) and the clustering metrics."""

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.engine.schedule import RoundSchedule, derive_seed, local_steps_per_client
from lightning_fedcluster.metrics.clustering import concept_ari, concept_shares


def schedule(num_clients: int = 30, clients_per_round: int = 10, seed: int = 0, steps=None) -> RoundSchedule:
    steps = torch.full((num_clients,), 5) if steps is None else torch.as_tensor(steps)
    return RoundSchedule(num_clients, clients_per_round, steps, seed=seed)


# --- derive_seed -------------------------------------------------------------------------------


def test_derive_seed_is_deterministic_and_63_bit() -> None:
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert derive_seed(7) == derive_seed(7)
    for parts in [(0,), (1, 2), (2**32 - 1, 299, 0x5EED), (12345, 3, 17, 0xBA7C)]:
        value = derive_seed(*parts)
        assert isinstance(value, int)
        assert 0 <= value < 2**63


def test_derive_seed_distinct_for_distinct_inputs() -> None:
    grid = list(itertools.product(range(4), range(25), range(1, 11)))  # (seed, round, client)
    seeds = {derive_seed(*parts) for parts in grid}
    assert len(seeds) == len(grid)
    # argument order matters
    assert derive_seed(0, 1) != derive_seed(1, 0)
    assert derive_seed(3, 5, 0x5EED) != derive_seed(3, 0x5EED, 5)


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


# --- assignment of clients to ranks ------------------------------------------------------------


STEPS = [3, 7, 1, 4, 4, 9, 2, 6, 5, 8, 1, 3]  # heterogeneous local steps, 12 clients


@pytest.mark.parametrize("round_index", [0, 1, 5])
def test_assignment_covers_round_clients_and_respects_capacity(round_index: int) -> None:
    sched = schedule(num_clients=12, clients_per_round=7, steps=STEPS, seed=5)
    clients = sched.clients(round_index).tolist()
    reference = None
    for world in (1, 2, 3, 4, 7, 10):
        per_rank = sched.assignment(round_index, world)
        assert len(per_rank) == world
        pairs = [pair for rank in per_rank for pair in rank]
        # every slot exactly once, and slot s is the s-th client of the round
        assert sorted(slot for slot, _ in pairs) == list(range(7))
        assert all(clients[slot] == client for slot, client in pairs)
        capacity = sched.items_per_rank(world)
        assert capacity == math.ceil(7 / world) * 9
        for rank in per_rank:
            assert sum(STEPS[client] for _, client in rank) <= capacity
            assert len(rank) <= math.ceil(7 / world)
        # the same (slot, client) pairs whatever the world size
        if reference is None:
            reference = sorted(pairs)
        assert sorted(pairs) == reference


def test_assignment_single_rank_orders_by_decreasing_steps() -> None:
    sched = schedule(num_clients=12, clients_per_round=12, steps=STEPS)
    (only,) = sched.assignment(0, 1)
    # all clients take part, so slot == client; ties keep the lower slot first
    assert [client for _, client in only] == [5, 9, 1, 7, 8, 3, 4, 0, 11, 6, 2, 10]
    assert sched.items_per_rank(1) == 12 * 9
    # round-robin dealing of that order over 3 ranks
    per_rank = sched.assignment(0, 3)
    assert [[client for _, client in rank] for rank in per_rank] == [
        [5, 7, 4, 6],
        [9, 8, 0, 2],
        [1, 3, 11, 10],
    ]


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


# --- clustering metrics ------------------------------------------------------------------------


def omega_for(assignments: list[int], k: int = 3) -> torch.Tensor:
    """ω rows peaked on the given clusters."""
    omega = torch.full((len(assignments), k), 0.1, dtype=torch.float64)
    omega[torch.arange(len(assignments)), torch.tensor(assignments)] = 1.0 - 0.1 * (k - 1)
    return omega


def test_concept_ari_perfect_relabelled_clustering() -> None:
    concept = torch.tensor([0, 0, 1, 1, 2, 2])
    omega = omega_for([2, 2, 0, 0, 1, 1])  # same partition, different cluster names
    assert concept_ari(omega, concept) == pytest.approx(1.0, abs=1e-12)


def test_concept_ari_by_hand() -> None:
    # true [0,0,0,1,1,1], clusters [0,0,1,1,1,1]: contingency [[2,1],[0,3]].
    # Σ C(n_ij, 2) = 1 + 0 + 0 + 3 = 4; rows 3, 3 -> 3 + 3 = 6; columns 2, 4 -> 1 + 6 = 7; C(6, 2) = 15.
    # ARI = (4 − 6·7/15) / ((6 + 7)/2 − 6·7/15) = 1.2 / 3.7
    omega = omega_for([0, 0, 1, 1, 1, 1], k=2)
    assert concept_ari(omega, torch.tensor([0, 0, 0, 1, 1, 1])) == pytest.approx(1.2 / 3.7, abs=1e-12)


def test_concept_ari_nan_with_fewer_than_two_seen_clients() -> None:
    omega = omega_for([0, 1, 2])
    concept = torch.tensor([0, 1, 2])
    assert math.isnan(concept_ari(omega, concept, seen=torch.tensor([False, True, False])))
    assert math.isnan(concept_ari(omega, concept, seen=torch.zeros(3, dtype=torch.bool)))
    assert math.isnan(concept_ari(omega[:1], concept[:1]))


def test_concept_ari_uses_only_seen_clients() -> None:
    concept = torch.tensor([0, 0, 1, 1, 0, 1])
    # the last two clients (never seen, still at their initial ω) would break the clustering
    omega = omega_for([1, 1, 0, 0, 0, 1], k=2)
    seen = torch.tensor([True, True, True, True, False, False])
    assert concept_ari(omega, concept, seen=seen) == pytest.approx(1.0, abs=1e-12)
    assert concept_ari(omega, concept) < 0.5


def test_concept_shares_by_hand() -> None:
    omega = torch.tensor([[0.8, 0.2], [0.4, 0.6], [0.1, 0.9]], dtype=torch.float32)
    concept = torch.tensor([0, 0, 1])
    sizes = torch.tensor([10, 20, 5])
    shares = concept_shares(omega, concept, sizes)
    # concept 0: 10·[0.8, 0.2] + 20·[0.4, 0.6] = [16, 14] over 30; concept 1: 5·[0.1, 0.9] over 5.
    expected = torch.tensor([[16 / 30, 14 / 30], [0.1, 0.9]], dtype=torch.float64)
    assert shares.dtype == torch.float64
    assert_close(shares, expected, rtol=1e-7, atol=1e-7)  # ω given in float32
    assert_close(shares.sum(dim=1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    # an explicit num_concepts adds an all-zero row for a concept with no clients
    padded = concept_shares(omega, concept, sizes, num_concepts=3)
    assert padded.shape == (3, 2)
    assert_close(padded[:2], expected, rtol=1e-7, atol=1e-7)
    assert torch.equal(padded[2], torch.zeros(2, dtype=torch.float64))
