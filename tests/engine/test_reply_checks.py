"""The server's checks of the clients' replies: each rule on hand-made tensors, then on the
Lightning engine (both executors), where a client whose update fails them is left out of the
round, named and counted, and a round without any accepted client stops the run."""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.engine.executors.loop import LoopExecutor
from lightning_fedcluster.engine.executors.vectorized import VectorizedExecutor
from lightning_fedcluster.engine.federation import NoClientsError
from lightning_fedcluster.engine.reply_checks import (
    ReplyLimits,
    all_finite,
    client_problems,
    finite_problems,
    norm_problems,
    shape_problems,
    simplex_problems,
    summed_problems,
)
from tests.conftest import make_trainer
from tests.flower import workload

ALIVE = torch.tensor([True, True, False])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_all_finite_equals_the_elementwise_test(dtype):
    """One float64 sum answers as ``isfinite(t).all()`` does: each kind of non-finite value alone,
    +inf with -inf (their sum is NaN, not finite), and the largest finite values of the dtype, whose
    sum overflows the dtype itself but not float64 (float64 tensors take the elementwise test)."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(4, 257, generator=generator).to(dtype)
    cases = {"finite": base, "largest": torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)}
    for name, values in {"nan": [float("nan")], "inf": [float("inf")], "-inf": [float("-inf")],
                         "inf and -inf": [float("inf"), float("-inf")]}.items():
        poisoned = base.clone().flatten()
        poisoned[torch.randperm(poisoned.numel(), generator=generator)[: len(values)]] = torch.tensor(
            values, dtype=dtype
        )
        cases[name] = poisoned.reshape(base.shape)
    for name, t in cases.items():
        assert all_finite(t) == bool(torch.isfinite(t).all()), name
    assert [name for name, t in cases.items() if not all_finite(t)] == ["nan", "inf", "-inf", "inf and -inf"]


def test_non_finite_tensors_are_named():
    named = {
        "cluster 0": torch.tensor([1.0, float("nan")]),
        "cluster 1": torch.ones(2),
        "ids": torch.arange(2),
    }
    assert finite_problems(named) == ["non-finite values in cluster 0"]
    assert finite_problems({"a": torch.tensor([float("inf")]), "b": torch.zeros(1)}) == [
        "non-finite values in a"
    ]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ([0.5, 0.4985, 0.0], "sum 0.9985"),  # a flipped byte in a stored ω row
        ([1.2, -0.2, 0.0], "smallest -0.2"),
        ([0.5, 0.3, 0.2], "on removed clusters 0.2"),
        ([float("nan"), 1.0, 0.0], "non-finite"),
    ],
)
def test_an_omega_row_off_the_simplex_of_the_alive_clusters_is_named(row, reason):
    omega = torch.tensor([[0.25, 0.75, 0.0], row], dtype=torch.float64)
    (problem,) = simplex_problems(omega, ALIVE, [7, 9])
    assert problem.startswith("client 9's ω") and reason in problem


def test_a_row_within_the_float64_rounding_of_a_softmax_passes():
    omega = torch.softmax(torch.randn(5, 2, dtype=torch.float64), 1)
    assert (
        simplex_problems(torch.cat([omega, torch.zeros(5, 1, dtype=torch.float64)], 1), ALIVE, range(5)) == []
    )


def test_update_norms_are_held_to_the_bound_per_unit_weight():
    assert norm_problems("cluster 1", 30.0, 10.0, 5.0) == []  # mean update 3
    assert norm_problems("cluster 1", 60.0, 10.0, 5.0) == [
        "cluster 1's update norm 6 exceeds max_update_norm=5"
    ]
    assert norm_problems("cluster 1", 1e300, 1e-300, None) == ["cluster 1's update norm overflows"]
    assert norm_problems("cluster 1", 1.0, 0.0, 5.0) == [], "no weight: nothing of it is applied"


def test_shapes_and_dtypes_are_those_declared():
    declared = {"omega": ((2, 3), torch.float64), "clients": ((2,), torch.long)}
    assert (
        shape_problems(
            {"omega": torch.zeros(2, 3, dtype=torch.float64), "clients": torch.arange(2)}, declared
        )
        == []
    )
    problems = shape_problems({"omega": torch.zeros(2, 2), "extra": torch.zeros(1)}, declared)
    assert problems == [
        "missing clients", "undeclared extra", "omega is float32 (2, 2), declared float64 (2, 3)",
    ]  # fmt: skip


def test_a_clients_update_is_checked_against_the_global_tensors_it_updates():
    reference = [torch.zeros(3), torch.zeros(2)]
    omega = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    near = [torch.ones(3), torch.zeros(2)]  # norm √3
    assert client_problems(4, [("cluster 0", near, reference)], omega, ALIVE, ReplyLimits(2.0)) == []
    assert client_problems(4, [("cluster 0", near, reference)], omega, ALIVE, ReplyLimits(1.0)) == [
        "cluster 0's update norm 1.732 exceeds max_update_norm=1"
    ]
    poisoned = [torch.ones(3), torch.tensor([float("nan"), 0.0])]
    assert client_problems(4, [("cluster 1", poisoned, reference)], omega, ALIVE, ReplyLimits()) == [
        "non-finite values in cluster 1"
    ]


def test_a_summed_reply_needs_weight_behind_every_update():
    deltas = [[torch.full((2,), 4.0, dtype=torch.float64)], [torch.zeros(2, dtype=torch.float64)]]
    omega = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    alive = torch.tensor([True, True])
    weights = torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)  # mean update of cluster 0: ‖(4,4)‖/2
    assert summed_problems(deltas, [], weights, omega, [3], alive, ReplyLimits(3.0)) == []
    assert summed_problems(deltas, [], weights, omega, [3], alive, ReplyLimits(2.0)) == [
        "cluster 0's update norm 2.828 exceeds max_update_norm=2"
    ]
    unweighted = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
    assert summed_problems(deltas, [], unweighted, omega, [3], alive, ReplyLimits()) == [
        "cluster 0 carries an update without weight"
    ]
    negative = torch.tensor([2.0, -1.0, 0.0], dtype=torch.float64)
    assert "negative weights" in summed_problems(deltas, [], negative, omega, [3], alive, ReplyLimits())[0]


# -- on the Lightning engine ---------------------------------------------------------------------
LOUD = 4  # the client whose inputs are scaled: its update is ~20 long, the others' below 0.4


def loud_datamodule():
    """The Flower workload's clients, with client 4's training inputs 30 times larger."""
    datamodule = workload.make_datamodule()
    start, stop = int(datamodule.train_offsets[LOUD]), int(datamodule.train_offsets[LOUD + 1])
    datamodule.train_x[start:stop] *= 30
    return datamodule


def bounded_strategy(executor: str = "loop", **options) -> lf.FedAvgStrategy:
    return lf.FedAvgStrategy(
        clients_per_round=5, local_steps=2, executor=executor, max_update_norm=5.0, **options
    )


def fit(strategy, rounds: int = 3):
    trainer = make_trainer(strategy, max_epochs=rounds, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(workload.MomentumMLP(), datamodule=loud_datamodule())
    return trainer.lightning_module, [str(w.message) for w in caught]


def loud_rounds(rounds: int = 3) -> list[int]:
    schedule = bounded_strategy().round_schedule(loud_datamodule())
    return [r for r in range(rounds) if LOUD in schedule.clients(r).tolist()]


def test_a_client_whose_update_exceeds_the_bound_is_left_out_named_and_counted():
    module, messages = fit(bounded_strategy())
    rounds = loud_rounds()
    assert rounds, "the schedule must sample the loud client"
    rejected = [m for m in messages if "is rejected" in m]
    assert len(rejected) == len(rounds) and all(
        f"the reply of client {LOUD} is rejected" in m for m in rejected
    )
    assert "exceeds max_update_norm=5" in rejected[0]
    assert not bool(module.client_state.seen[LOUD]), "a rejected client's report is not stored"
    assert torch.equal(module.client_state.omega[LOUD], torch.ones(1, dtype=torch.float64))
    if rounds[-1] == 2:
        assert module.round_metrics["train/rejected"] == 1.0 and module.round_metrics["train/clients"] == 4.0


def test_without_a_bound_the_loud_client_is_aggregated():
    unbounded, _ = fit(lf.FedAvgStrategy(clients_per_round=5, local_steps=2, executor="loop"))
    bounded, _ = fit(bounded_strategy())
    assert bool(unbounded.client_state.seen[LOUD])
    assert not torch.equal(unbounded.models[0].net[0].weight, bounded.models[0].net[0].weight)


def test_the_vectorised_executor_rejects_the_same_client_with_the_same_result():
    loop, _ = fit(bounded_strategy("loop"))
    vectorized, messages = fit(bounded_strategy("vectorized"))
    assert sum("is rejected" in m for m in messages) == len(loud_rounds())
    for name, tensor in loop.state_dict().items():
        torch.testing.assert_close(vectorized.state_dict()[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert torch.equal(loop.client_state.seen, vectorized.client_state.seen)


def test_a_round_with_too_few_accepted_clients_is_not_applied():
    first = loud_rounds()[0]
    module, messages = fit(bounded_strategy(min_clients_per_round=5), rounds=first + 1)
    expected = f"round {first + 1} is not applied: 4 client(s) accepted, fewer than min_clients_per_round=5"
    assert any(expected in m for m in messages)
    if first == 0:  # nothing applied: the models are still the initial ones
        initial = lf.ClusteredModule(workload.MomentumMLP(), 1, seed=0)
        for name, tensor in initial.state_dict().items():
            assert torch.equal(module.state_dict()[name], tensor), name


def test_a_round_that_trains_no_client_stops_the_run():
    with pytest.raises(NoClientsError, match="round 1 trained no client: of its 5 clients, 5 sent replies"):
        fit(
            bounded_strategy().__class__(
                clients_per_round=5, local_steps=2, executor="loop", max_update_norm=1e-6
            )
        )


def never_training(executor: str, client: int):
    """A patch of ``executor`` under which ``client`` is never trained: its slot is skipped (the
    schedule, and every other client's work, unchanged)."""
    if executor == "loop":
        original = LoopExecutor.train_client

        def train_client(self, round_state, slot):
            if int(self.clients.ids[round_state.clients[slot]]) != client:
                original(self, round_state, slot)

        return LoopExecutor, "train_client", train_client
    original_chunk = VectorizedExecutor.run_chunk

    def run_chunk(self, round_state, slots):
        kept = [s for s in slots if int(self.clients.ids[round_state.clients[s]]) != client]
        if kept:
            original_chunk(self, round_state, kept)

    return VectorizedExecutor, "run_chunk", run_chunk


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_a_rejected_client_leaves_no_trace(executor, monkeypatch):
    """The run in which the loud client's replies are rejected equals the run in which it never
    trained: models, the client store with the persistent optimizer store (as checkpointed), and
    the last round's training metrics (its loss left out; counted in train/rejected only)."""
    rounds = loud_rounds()[-1] + 1
    strategy = partial(bounded_strategy, executor, optimizer_state="persist")
    rejected, messages = fit(strategy(), rounds)
    assert sum("is rejected" in m for m in messages) == len(loud_rounds(rounds))
    with monkeypatch.context() as patch:
        patch.setattr(*never_training(executor, LOUD))
        reference, messages = fit(strategy(), rounds)
    assert not any("is rejected" in m for m in messages)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(rejected.state_dict()[name], tensor), name
    stored, expected = rejected.client_state.state_dict(), reference.client_state.state_dict()
    assert "optimizer.ids" in expected and LOUD not in expected["optimizer.ids"].tolist()
    assert stored.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(stored[name], tensor), name
    assert rejected.round_metrics["train/rejected"] == 1.0 and reference.round_metrics["train/rejected"] == 0
    for name in ("train/loss", "train/acc", "train/clients"):
        assert rejected.round_metrics[name] == reference.round_metrics[name], name
