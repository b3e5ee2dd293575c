"""engine/client.py: the client contract every executor shares, function by function, on tensors small
enough to work out by hand: the rule's view of a client (each declared scope, K == M so a [K] entry
cannot pass for a client's row), the minibatch order, the E-step and plan (``prepare``), which
client a non-finite loss is blamed on, the prediction weights per row, the training metric sums
and the contributions (one by one and as the [C, K, K] matrix, C == K); and that a rule reading
no per-sample losses (FedAvg, FedProx) gets no E-step pass (``needs_loss_pass``): no no-grad
forward over the training rows, the same weights, training metrics from the local steps."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms.base import Algorithm, ClientReport, Contribution, LocalPlan
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.fedprox import FedProx
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.protocols import ClientOutputs
from lightning_fedcluster.algorithms.seeds import CLIENT_RNG, MINIBATCH_ORDER, derive_seed
from lightning_fedcluster.engine.client import (
    ClientWork,
    client_context,
    contribution_matrix,
    contributions,
    minibatch_order,
    needs_loss_pass,
    non_finite_error,
    prediction_weights_per_row,
    prepare,
    train_metric_sums,
    trained_copies,
)
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

LN3 = math.log(3.0)  # a loss gap of ln 3 under a uniform ω: γ = softmax(0, -ln 3) = (3/4, 1/4)


def _context(
    rule: Algorithm, state: ClientState, client: int, offsets: list[int], slot: int | None = None, **options
):
    """Round 4's context of ``client``, owning rows offsets[slot]:offsets[slot + 1] (slot: the client)."""
    slot = client if slot is None else slot
    start, stop = offsets[slot], offsets[slot + 1]
    return client_context(
        rule, state, client, 4, num_samples=stop - start, num_classes=2, sample_rows=(start, stop), seed=9,
        **options,
    )  # fmt: skip


# --- non_finite_error --------------------------------------------------------------------------


def test_the_non_finite_error_names_round_client_place_and_fix():
    error = non_finite_error(4, 7, "at local step 2")  # round index 4: the fifth round
    assert isinstance(error, FloatingPointError)
    assert str(error) == (
        "non-finite loss in round 5 at client 7 at local step 2: lower the learning rate or check "
        "client 7's data for NaN/inf"
    )


# --- client_context ----------------------------------------------------------------------------

K = M = 3  # a per-cluster [K] entry is shaped like a per-client [M] one: only its scope tells


class Declared(Algorithm):
    """A rule declaring one entry of every scope, and one the store does not hold."""

    def state_entries(self) -> tuple[StateEntry, ...]:
        return (
            StateEntry("gamma", Scope.SAMPLE, (K,)),
            StateEntry("last", Scope.CLIENT),
            StateEntry("centre", Scope.CLUSTER),
            StateEntry("total", Scope.SCALAR, (2,)),
            StateEntry("absent", Scope.CLIENT),
        )


def _declared_store() -> ClientState:
    """M = K = 3 clients of 2 samples each (6 sample rows), every entry's values distinct."""
    rule = Declared(K)
    state = ClientState.initial(M, 2, K, rule.state_entries()[:-1], num_samples=6)
    state.extra["gamma"] = torch.arange(18, dtype=torch.float64).view(6, K)
    state.extra["last"] = torch.tensor([10.0, 11.0, 12.0], dtype=torch.float64)
    state.extra["centre"] = torch.tensor([20.0, 21.0, 22.0], dtype=torch.float64)
    state.extra["total"] = torch.tensor([30.0, 31.0], dtype=torch.float64)
    state.omega[1] = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    state.seen[1] = True
    state.active = torch.tensor([True, False, True])
    return state


def test_the_context_holds_the_clients_row_and_each_entry_by_its_scope():
    rule, state = Declared(K), _declared_store()
    membership = torch.tensor([[True, False, False], [False, True, True], [True, True, False]])
    context = _context(rule, state, 1, [0, 2, 4, 6], membership=membership)
    assert (context.client, context.round_index, context.num_samples, context.num_classes) == (1, 4, 2, 2)
    assert context.omega.tolist() == [0.2, 0.3, 0.5] and context.seen is True
    assert context.active.tolist() == [True, False, True]
    assert context.seed_parts == (9, 4, 1, CLIENT_RNG)
    assert context.membership.tolist() == [False, True, True]
    assert sorted(context.extra) == ["centre", "gamma", "last", "total"]  # "absent": not in the store
    assert context.extra["gamma"].tolist() == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]  # its samples 2:4
    assert float(context.extra["last"]) == 11.0  # its row
    assert context.extra["centre"].tolist() == [20.0, 21.0, 22.0]  # every cluster's, not row 1's
    assert context.extra["total"].tolist() == [30.0, 31.0]


def test_a_node_reads_its_store_by_row_and_names_the_client_by_its_global_id():
    """On a Flower node the store holds only its clients: row 1 of it is global client 7; the
    seed and the server's membership [M_global, K] go by the global id."""
    rule, state = Declared(K), _declared_store()
    membership = torch.zeros(8, K, dtype=torch.bool)
    membership[7, 2] = True
    context = client_context(
        rule, state, 7, 4, num_samples=2, num_classes=2, sample_rows=(2, 4), seed=9,
        membership=membership, row=1,
    )  # fmt: skip
    assert context.client == 7 and context.seed_parts == (9, 4, 7, CLIENT_RNG)
    assert context.omega.tolist() == [0.2, 0.3, 0.5] and context.seen is True
    assert float(context.extra["last"]) == 11.0
    assert context.membership.tolist() == [False, False, True]
    unseen = _context(rule, state, 0, [0, 2, 4, 6])
    assert unseen.omega.tolist() == pytest.approx([1 / 3] * 3) and unseen.seen is False
    assert unseen.membership is None and float(unseen.extra["last"]) == 10.0


# --- trained_copies ----------------------------------------------------------------------------


def test_a_copy_trains_unless_its_sample_weights_sum_to_zero():
    plan = LocalPlan(clusters=(0, 2))
    assert trained_copies(plan, None) == (0, 2)  # weight 1 everywhere
    weights = torch.tensor([[0.5, 0.0], [0.5, 0.0]])  # column s is copy plan.clusters[s]
    assert trained_copies(plan, weights) == (0,)
    assert trained_copies(plan, torch.tensor([[0.0, 1e-30]])) == (2,)
    assert trained_copies(plan, torch.zeros(2, 2)) == ()
    assert trained_copies(LocalPlan(clusters=(1,)), torch.zeros(0, 1)) == ()  # no rows: nothing to train


# --- minibatch_order ---------------------------------------------------------------------------


def test_the_minibatch_order_is_the_named_stream_of_seed_round_client_and_epoch():
    # The stream every recorded number depends on: changing it changes results.
    assert minibatch_order(0, 0, 0, 8).tolist() == [2, 0, 1, 7, 6, 4, 3, 5]
    assert minibatch_order(0, 0, 0, 8, epoch=1).tolist() == [6, 3, 0, 5, 2, 4, 7, 1]
    generator = torch.Generator().manual_seed(derive_seed(5, 3, 2, MINIBATCH_ORDER, 4))
    assert torch.equal(minibatch_order(5, 3, 2, 10, epoch=4), torch.randperm(10, generator=generator))
    # Epoch 0 is the round's permutation (local_steps counts steps, not epochs).
    assert torch.equal(minibatch_order(5, 3, 2, 10, epoch=0), minibatch_order(5, 3, 2, 10))
    orders = {
        tuple(minibatch_order(*parts, 10).tolist()) for parts in [(5, 3, 2), (6, 3, 2), (5, 4, 2), (5, 3, 1)]
    }
    assert len(orders) == 4  # each of seed, round and client changes it
    assert all(sorted(order) == list(range(10)) for order in orders)


def test_the_minibatch_order_ignores_the_global_generator():
    torch.manual_seed(0)
    first = minibatch_order(5, 3, 2, 10)
    torch.manual_seed(1)
    torch.rand(3)
    assert torch.equal(minibatch_order(5, 3, 2, 10), first)


def test_the_minibatch_order_of_one_row_and_of_none():
    assert minibatch_order(0, 0, 0, 1).tolist() == [0]
    assert minibatch_order(0, 0, 0, 0).tolist() == []


# --- prepare -----------------------------------------------------------------------------------


def _round_contexts(rule: Algorithm, state: ClientState, ids, offsets) -> list:
    """Round 4's contexts of clients ``ids``, client c owning rows offsets[c]:offsets[c + 1]."""
    return [_context(rule, state, client, offsets, slot=c) for c, client in enumerate(ids)]


def _two_clients(rule: Algorithm, ids: tuple[int, int] = (5, 7)):
    """Client ids[0] owns rows 0:2, ids[1] row 2:3 (a single row); K = 2, uniform ω."""
    state = ClientState.initial(8, 2, 2)
    offsets = [0, 2, 3]
    contexts = _round_contexts(rule, state, ids, offsets)
    losses = torch.tensor([[0.0, LN3], [LN3, 0.0], [0.0, LN3]], dtype=torch.float64)
    return losses, torch.tensor([0, 1, 1]), torch.tensor(offsets), contexts


def test_prepare_gives_each_client_its_e_step_plan_weights_and_order():
    rule = Algorithm(2)  # the default soft mixture: every active copy trained with γ, weight N_i
    losses, labels, offsets, contexts = _two_clients(rule)
    first, second = prepare(rule, losses, labels, offsets, contexts, [3, 1], None, seed=9)
    # Client 5: γ = (3/4, 1/4) on row 0 and (1/4, 3/4) on row 1, so ω = (1/2, 1/2); label sums
    # S[y, k] = Σ_{y_j = y} γ_jk: row 0 has label 0, row 1 label 1.
    assert (first.client, first.slot, first.start, first.stop) == (5, 3, 0, 2)
    torch.testing.assert_close(
        first.report.gamma, torch.tensor([[0.75, 0.25], [0.25, 0.75]], dtype=torch.float64)
    )
    torch.testing.assert_close(first.report.omega, torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(
        first.report.label_sums, torch.tensor([[0.75, 0.25], [0.25, 0.75]], dtype=torch.float64)
    )
    assert first.plan.clusters == (0, 1) and first.trained == (0, 1)
    assert first.sample_weights.dtype == torch.float32
    torch.testing.assert_close(first.sample_weights, torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    assert torch.equal(first.order, minibatch_order(9, 4, 5, 2))  # by the client's id, not its slot
    # Client 7, a single row of label 1: γ = ω = (3/4, 1/4), all its mass on label 1.
    assert (second.client, second.slot, second.start, second.stop) == (7, 1, 2, 3)
    torch.testing.assert_close(second.report.omega, torch.tensor([0.75, 0.25], dtype=torch.float64))
    torch.testing.assert_close(
        second.report.label_sums, torch.tensor([[0.0, 0.0], [0.75, 0.25]], dtype=torch.float64)
    )
    assert second.order.tolist() == [0] and second.context is contexts[1]


class CopyOneOnly(Algorithm):
    """A hard plan: copy 1 with weight 1 (no sample weights), copy 0 never."""

    def local_plan(self, report: ClientReport, context) -> LocalPlan:
        return LocalPlan(clusters=(1,))


def test_prepare_without_sample_weights_trains_every_planned_copy():
    rule = CopyOneOnly(2)
    losses, labels, offsets, contexts = _two_clients(rule)
    works = prepare(rule, losses, labels, offsets, contexts, [0, 1], None, seed=9)
    assert [(w.sample_weights, w.trained) for w in works] == [(None, (1,)), (None, (1,))]


class ReadsOutputs(Algorithm, ClientOutputs):
    """Records the model outputs each client's context carries into its E-step."""

    seen_outputs: list

    def e_step_many(self, losses, labels, offsets, contexts, log_label_stats):
        self.seen_outputs = [context.outputs for context in contexts]
        return super().e_step_many(losses, labels, offsets, contexts, log_label_stats)


def test_prepare_hands_each_client_its_rows_of_the_outputs_only_to_a_rule_that_reads_them():
    outputs = torch.arange(12, dtype=torch.float32).view(2, 3, 2)  # [K, N, C]
    rule = ReadsOutputs(2)
    losses, labels, offsets, contexts = _two_clients(rule)
    prepare(rule, losses, labels, offsets, contexts, [0, 1], None, 9, outputs=outputs)
    assert torch.equal(rule.seen_outputs[0], outputs[:, 0:2]) and torch.equal(
        rule.seen_outputs[1], outputs[:, 2:3]
    )
    rule.uses_client_outputs = False
    prepare(rule, losses, labels, offsets, contexts, [0, 1], None, 9, outputs=outputs)
    assert rule.seen_outputs == [None, None]


@pytest.mark.parametrize(
    ("row", "offsets", "ids", "blamed"),
    [
        (1, [0, 2, 3], (5, 7), 5),  # the last row of the first client
        (2, [0, 2, 3], (5, 7), 7),  # the first row of the second (a single row)
        (2, [0, 2, 2, 3], (5, 6, 7), 7),  # past a client without rows: the one that owns row 2
        (0, [0, 3], (5,), 5),
    ],
)
def test_a_non_finite_e_step_loss_is_blamed_on_the_client_that_owns_the_row(row, offsets, ids, blamed):
    rule = Algorithm(2)
    state = ClientState.initial(8, 2, 2)
    contexts = _round_contexts(rule, state, ids, offsets)
    losses = torch.zeros(3, 2, dtype=torch.float64)
    losses[row, 1] = math.nan if row % 2 else math.inf
    with pytest.raises(FloatingPointError, match=rf"in round 5 at client {blamed} in its E-step pass"):
        prepare(rule, losses, torch.zeros(3, dtype=torch.long), torch.tensor(offsets), contexts, ids, None, 9)


# --- prediction_weights_per_row ----------------------------------------------------------------


def _work(
    client: int, start: int, stop: int, omega: list[float], plan=None, weights=None, dtype=torch.float64
):
    """A client's turn with report ω (and γ = ω on each row), planned on the default rule's terms."""
    k = len(omega)
    omega_t = torch.tensor(omega, dtype=dtype)
    report = ClientReport(omega_t.expand(stop - start, k), omega_t, torch.zeros(2, k, dtype=torch.float64))
    context = client_context(
        Algorithm(k), ClientState.initial(8, 2, k), client, 0, num_samples=stop - start, num_classes=2,
        sample_rows=(start, stop), seed=0,
    )  # fmt: skip
    plan = plan or LocalPlan(clusters=tuple(range(k)))
    order = minibatch_order(0, 0, client, stop - start)
    return ClientWork(
        client, 0, start, stop, context, report, plan, weights, order, trained_copies(plan, weights)
    )


def test_prediction_weights_repeat_each_clients_omega_over_its_rows():
    works = [_work(0, 0, 2, [0.25, 0.75]), _work(1, 2, 2, [0.5, 0.5]), _work(2, 2, 3, [0.6, 0.4])]
    soft = prediction_weights_per_row(Algorithm(2), works, torch.device("cpu"))
    assert soft.dtype == torch.float64  # client 1 has no rows, so no weights
    assert soft.tolist() == [[0.25, 0.75], [0.25, 0.75], [0.6, 0.4]]
    hard = Algorithm(2)
    hard.hard_prediction = True  # the argmax-ω model
    assert prediction_weights_per_row(hard, works, torch.device("cpu")).tolist() == [
        [0.0, 1.0], [0.0, 1.0], [1.0, 0.0],
    ]  # fmt: skip
    single = [_work(0, 0, 1, [0.25, 0.75], dtype=torch.float32)]  # a float32 ω: float64 weights still
    assert prediction_weights_per_row(Algorithm(2), single, torch.device("cpu")).dtype == torch.float64


# --- train_metric_sums -------------------------------------------------------------------------

# K = 2 models' class probabilities on N = 2 rows, C = 2 classes: [K, N, C].
PROBABILITIES = torch.tensor([[[0.8, 0.2], [0.4, 0.6]], [[0.2, 0.8], [0.6, 0.4]]])


def test_train_metric_sums_of_a_classification_mixture_per_row():
    # Row 0 takes model 0 alone: p = (0.8, 0.2), label 0: right, -ln 0.8.
    # Row 1 mixes 1/4, 3/4: p = (0.1 + 0.45, 0.15 + 0.3) = (0.55, 0.45), label 1: wrong, -ln 0.45.
    weights = torch.tensor([[1.0, 0.0], [0.25, 0.75]], dtype=torch.float64)
    sums = train_metric_sums(PROBABILITIES, torch.tensor([0, 1]), weights, Task.CLASSIFICATION)
    assert sums.dtype == torch.float64 and sums.shape == (3,)
    torch.testing.assert_close(
        sums, torch.tensor([-math.log(0.8) - math.log(0.45), 1.0, 2.0], dtype=torch.float64)
    )


def test_train_metric_sums_with_one_weight_vector_for_every_row():
    # ω = (1/2, 1/2): p = (0.5, 0.5) on both rows; argmax ties go to class 0 (right for row 0 only).
    sums = train_metric_sums(
        PROBABILITIES, torch.tensor([0, 1]), torch.tensor([0.5, 0.5]), Task.CLASSIFICATION
    )
    torch.testing.assert_close(sums, torch.tensor([2 * math.log(2.0), 1.0, 2.0], dtype=torch.float64))


def test_train_metric_sums_of_a_regression_mixture():
    # Predictions [K, N, 1]: model 0 says (1, 2), model 1 (3, 6). Row 0 mixes 1/2, 1/2: 2 (target
    # 1, error 1); row 1 mixes 1/4, 3/4: 0.5 + 4.5 = 5 (target 3, error 4). Both sums are the SSE.
    predictions = torch.tensor([[[1.0], [2.0]], [[3.0], [6.0]]])
    weights = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64)
    sums = train_metric_sums(predictions, torch.tensor([1.0, 3.0]), weights, Task.REGRESSION)
    assert sums.tolist() == [5.0, 5.0, 2.0]


def test_train_metric_sums_of_no_rows_are_zero():
    sums = train_metric_sums(
        torch.zeros(2, 0, 2), torch.zeros(0, dtype=torch.long), torch.zeros(0, 2), Task.CLASSIFICATION
    )
    assert sums.tolist() == [0.0, 0.0, 0.0]


def test_an_unknown_task_is_refused_where_it_enters_and_the_engine_takes_a_task():
    # The datamodule and the hosts convert the user's string (Task.of); the engine gets a Task.
    with pytest.raises(ValueError, match="task must be one of"):
        Task.of("ranking")
    with pytest.raises(AttributeError):
        train_metric_sums(PROBABILITIES, torch.tensor([0, 1]), torch.tensor([0.5, 0.5]), "classification")


# --- contributions and contribution_matrix ------------------------------------------------------


class Routing(Algorithm):
    """Copy 0 goes into cluster 1 (twice: weight N and 0.5), copy 1 into cluster 1 with weight
    N + 1 and into cluster 0 with weight 0."""

    def contributions(self, report, plan, context) -> list[Contribution]:
        n = float(context.num_samples)
        return [
            Contribution(0, 1, n),
            Contribution(1, 1, n + 1),
            Contribution(1, 0, 0.0),
            Contribution(0, 1, 0.5),
        ]


def _routed_works():
    """C = K = 2 (the matrix [C, K, K] must not be read transposed): client 0 (2 rows) trains both
    copies; client 1 (1 row) gives copy 1 zero weight, so it trains copy 0 only."""
    both = torch.tensor([[1.0, 0.5], [0.0, 0.5]])
    first_only = torch.tensor([[1.0, 0.0]])
    return [_work(0, 0, 2, [0.5, 0.5], weights=both), _work(1, 2, 3, [0.5, 0.5], weights=first_only)]


def test_contributions_keep_those_of_trained_copies_with_positive_weight():
    rule = Routing(2)
    first, second = _routed_works()
    assert first.trained == (0, 1) and second.trained == (0,)
    assert contributions(rule, first, first.report) == [
        Contribution(0, 1, 2.0), Contribution(1, 1, 3.0), Contribution(0, 1, 0.5),
    ]  # fmt: skip
    assert contributions(rule, second, second.report) == [Contribution(0, 1, 1.0), Contribution(0, 1, 0.5)]
    assert contributions(Algorithm(2), first, first.report) == [
        Contribution(0, 0, 2.0),
        Contribution(1, 1, 2.0),
    ]


class ToAssigned(Algorithm):
    """Every trained copy goes into the cluster of the report's ω (a reassignment after training)."""

    def contributions(self, report, plan, context) -> list[Contribution]:
        target = int(report.omega.argmax())
        return [Contribution(k, target, 1.0) for k in plan.clusters]


def test_contributions_follow_the_report_they_are_given():
    work = _work(0, 0, 2, [1.0, 0.0], plan=LocalPlan(clusters=(0,)))
    revised = ClientReport(
        work.report.gamma, torch.tensor([0.0, 1.0], dtype=torch.float64), work.report.label_sums
    )
    assert contributions(ToAssigned(2), work, work.report) == [Contribution(0, 0, 1.0)]
    assert contributions(ToAssigned(2), work, revised) == [Contribution(0, 1, 1.0)]


def test_the_contribution_matrix_sums_weights_by_client_source_and_target():
    mix = contribution_matrix(Routing(2), _routed_works(), 2)
    assert mix.dtype == torch.float64 and mix.shape == (2, 2, 2)
    # mix[c, s, t]: client 0's copy 0 -> cluster 1 twice (2 + 0.5), copy 1 -> cluster 1 (3);
    # client 1's copy 0 -> cluster 1 twice (1 + 0.5), its untrained copy 1 nothing.
    assert mix.tolist() == [[[0.0, 2.5], [0.0, 3.0]], [[0.0, 1.5], [0.0, 0.0]]]


def test_the_contribution_matrix_of_clients_that_train_nothing_is_zero():
    idle = _work(0, 0, 2, [0.5, 0.5], weights=torch.zeros(2, 2))
    assert contribution_matrix(Routing(2), [idle], 2).tolist() == [[[0.0, 0.0], [0.0, 0.0]]]
    assert contribution_matrix(Routing(2), [], 2).shape == (0, 2, 2)


SIZES = (9, 14, 5, 11)


def labels_of(x: torch.Tensor) -> torch.Tensor:
    """Labels that are a function of the inputs, so a forward's rows give their labels."""
    return (x[:, 0] * 3).long().clamp(0, 2)


def datamodule() -> lf.FederatedDataModule:
    generator = torch.Generator().manual_seed(0)
    splits = []
    for n in SIZES:
        x = torch.rand(n, 6, generator=generator)
        splits.append((x, labels_of(x)))
    return lf.FederatedDataModule(splits, [(x[:2], y[:2]) for x, y in splits], num_classes=3, batch_size=4)


class Recording(MLPClassifier):
    """Counts the rows each forward sees without gradients (E-step passes, evaluation) while
    ``recording``, and keeps the inputs and outputs of the forwards with gradients (local steps)."""

    recording = False
    no_grad_rows = 0
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if Recording.recording:
            if torch.is_grad_enabled():
                Recording.steps.append((x.detach().clone(), out.detach().clone()))
            else:
                Recording.no_grad_rows += x.shape[0]
        return out


class RecordLastRound(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        Recording.recording, Recording.no_grad_rows, Recording.steps = True, 0, []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        Recording.recording = False


def fit(strategy: lf.FederatedStrategy) -> lf.ClusteredModule:
    torch.manual_seed(0)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0, callbacks=[RecordLastRound()])
    trainer.fit(Recording(in_features=6, num_classes=3, hidden=(8,), lr=0.2), datamodule=datamodule())
    return trainer.lightning_module


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_fedavg_runs_no_forward_without_gradients_over_the_training_rows(executor):
    fit(lf.FedAvgStrategy(local_epochs=1, executor=executor, seed=0))
    assert Recording.no_grad_rows == 0
    fit(lf.FedProxStrategy(mu=0.1, local_epochs=1, executor=executor, seed=0))
    assert Recording.no_grad_rows == 0
    # A clustered rule needs the pass: every client's rows once per round, through each of the K = 2
    # models (the vectorised executor forwards them in one vmapped call).
    fit(lf.FedRCStrategy(2, local_epochs=1, executor=executor, seed=0))
    assert Recording.no_grad_rows == (2 if executor == "loop" else 1) * sum(SIZES)


def test_fedavgs_training_metrics_are_the_local_steps_mean_loss_and_accuracy():
    """The loop's round metrics are the mean cross-entropy and accuracy of every row of every
    local step, as the steps' own forwards saw them (dropout and all)."""
    module = fit(lf.FedAvgStrategy(local_epochs=2, executor="loop", seed=0))
    x = torch.cat([x for x, _ in Recording.steps])
    logits = torch.cat([out for _, out in Recording.steps])
    y = labels_of(x)
    assert x.shape[0] == 2 * sum(SIZES)  # two local epochs of every client's rows, nothing else
    loss = F.cross_entropy(logits.double(), y).item()
    accuracy = (logits.argmax(1) == y).double().mean().item()
    assert module.round_metrics["train/loss"] == pytest.approx(loss, rel=1e-6)
    assert module.round_metrics["train/acc"] == pytest.approx(accuracy, abs=1e-12)


@pytest.mark.parametrize("options", [{"local_epochs": 2}, {"local_steps": 3}])
def test_the_executors_agree_on_the_step_metrics(options):
    metrics = {}
    for executor in ("loop", "vectorized"):
        module = fit(lf.FedAvgStrategy(executor=executor, seed=0, **options))
        metrics[executor] = module.round_metrics
    for name in ("train/loss", "train/acc"):  # the weights agree to float32 rounding (test_vectorized.py)
        assert math.isfinite(metrics["loop"][name])
        assert metrics["vectorized"][name] == pytest.approx(metrics["loop"][name], rel=1e-6)


class FedProxReadingOutputs(FedProx, ClientOutputs):
    pass


class OwnLoss(MLPClassifier):
    def per_sample_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="none")


def test_only_a_one_model_assignment_that_reads_nothing_skips_the_pass():
    model = MLPClassifier(in_features=6, num_classes=3)
    assert not needs_loss_pass(FedProx(0.0), model)
    assert not needs_loss_pass(FedProx(0.1), model)
    assert needs_loss_pass(FedRC(1), model)  # a one-cluster mixture still reads its losses
    assert needs_loss_pass(FedProxReadingOutputs(0.0), model)
    assert needs_loss_pass(FedProx(0.0), OwnLoss(in_features=6, num_classes=3))  # its outputs unseen
