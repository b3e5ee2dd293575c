"""algorithms/aggregation.py: the server's weighted update by hand, zero weights, and float64
accumulation independent of the order."""

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update
from lightning_fedcluster.algorithms.base import Algorithm
from tests.helpers.algorithms import F64, TIGHT, ctx, t


def test_zero_weight_client_changes_nothing_in_the_average():
    from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update

    reference = [t([1.0, 2.0])]
    accumulator = [torch.zeros(2, dtype=F64)]
    accumulate_delta(accumulator, [t([3.0, 2.0])], reference, 5.0)  # Δ = [2, 0], weight 5
    accumulate_delta(accumulator, [t([100.0, -50.0])], reference, 0.0)  # a zero-weight client
    model = [reference[0].clone()]
    apply_weighted_update(model, accumulator, 5.0)
    assert_close(model[0], t([3.0, 2.0]), **TIGHT)
    # A soft cluster with zero responsibility on a client is not trained and gets no update from it.
    rule = Algorithm(2)
    report = rule.e_step(t([[0.0, 1e6]]), torch.tensor([0]), ctx([1.0, 0.0]), None)
    assert report.gamma[0, 1] == 0.0

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
