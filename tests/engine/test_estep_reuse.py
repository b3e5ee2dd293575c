"""engine/estep_reuse.py: ``reuse_estep_forward`` shares one forward between a client's E-step pass
and its first local step.

Tolerance. With the option the E-step reads the first step's rows' losses from a forward of those
rows (with gradients) instead of from the no-grad pass over all the client's rows; the two
forwards may round differently (another batch size and row order reach other kernels), by a few
float32 ulps per loss. That moves γ and ω by about as much and, through the weighted step, the
weights: a short run is compared with the tolerance the loop and vectorised executors are held to
(``tests/engine/executors/test_vectorized.py``: weights rtol 1e-4, atol 1e-5; ω atol 1e-5), which
is the same kind of difference (float summation order); on the vectorised executor the first
step's gradient also comes from autograd instead of ``torch.func.grad``. On the loop executor the
first step's loss itself is the plain turn's, bit for bit, for the same weights
(``test_the_first_steps_loss_is_the_fresh_forwards``). A resumed run is exact: the option is a
pure function of the round's state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine import estep_reuse
from lightning_fedcluster.engine.executors import loop, vectorized
from lightning_fedcluster.engine.executors.loop import ClientTurn, batch_index
from lightning_fedcluster.engine.losses import per_sample_loss
from lightning_fedcluster.engine.runtime import LocalSetup
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.models import MLPClassifier, SmallCNN
from lightning_fedcluster.strategies.round_arguments import Execution
from tests.conftest import make_trainer
from tests.helpers.weights import assert_same_fit

WEIGHTS = {"rtol": 1e-4, "atol": 1e-5}


def _setup(local_epochs: int | None = None, drop_last: bool = False, batch_size: int = 16) -> LocalSetup:
    torch.manual_seed(0)
    copies = lf.ClusteredModule(MLPClassifier(hidden=(16,)), 3).copies
    return LocalSetup(
        copies, FedRC(3), Task.CLASSIFICATION, 0, 64, batch_size, local_epochs, drop_last, torch.device("cpu")
    )


@pytest.mark.parametrize(
    ("local_epochs", "drop_last", "n"), [(None, False, 40), (None, False, 10), (1, True, 40)]
)
def test_the_first_step_rows_are_step_zeros_batch(local_epochs, drop_last, n) -> None:
    setup = _setup(local_epochs, drop_last)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    work = SimpleNamespace(order=order, client=0, context=SimpleNamespace(round_index=0))
    turn = ClientTurn(work, torch.zeros(n, 64), torch.zeros(n), torch.zeros(3), {0: order})
    rows = estep_reuse.first_step_rows(setup, order, steps=2)
    assert rows is not None and torch.equal(rows, batch_index(setup, turn, 0))
    assert estep_reuse.first_step_rows(setup, order, steps=0) is None


def test_the_reused_pass_is_the_pass_and_keeps_the_first_steps_forward() -> None:
    setup = _setup()
    dm = DigitsFederated(num_clients=4, seed=0)
    x, y = dm.train_split(0)
    rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(2))[:16]
    losses, outputs, first = estep_reuse.reused_pass(setup, x, y, rows)
    plain_losses, plain_outputs = setup.evaluate(x, y)
    torch.testing.assert_close(losses, plain_losses, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outputs, plain_outputs, rtol=1e-6, atol=1e-6)
    assert not losses.requires_grad and not outputs.requires_grad
    assert torch.equal(first.rows, rows) and len(first.losses) == 3
    for model, kept in zip(setup.models, first.losses, strict=True):
        assert kept.requires_grad
        assert torch.equal(kept, per_sample_loss(model, x[rows], y[rows], setup.task))


def _fit(model, reuse: bool, executor: str = "loop", rounds: int = 3, images: bool = False, **options):
    dm = DigitsFederated(num_clients=12, concepts=3, as_images=images, batch_size=32, seed=0)
    options = {"local_steps": 2, **options}
    strategy = lf.FedRCStrategy(
        3, clients_per_round=6, executor=executor, reuse_estep_forward=reuse, **options
    )
    trainer = make_trainer(strategy, max_epochs=rounds, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    return trainer.lightning_module


def _assert_close_runs(expected, got) -> None:
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(got.state_dict()[name], tensor, **WEIGHTS, msg=name)
    torch.testing.assert_close(got.client_state.omega, expected.client_state.omega, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        got.client_state.label_sums, expected.client_state.label_sums, atol=1e-4, rtol=1e-5
    )
    for name, value in expected.round_metrics.items():
        assert got.round_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("images", [False, True], ids=["mlp", "cnn"])
def test_a_fedrc_run_with_the_option_equals_one_without_within_float_tolerance(monkeypatch, images) -> None:
    calls = []
    monkeypatch.setattr(loop, "reused_pass", lambda *a: calls.append(1) or estep_reuse.reused_pass(*a))

    def model():
        torch.manual_seed(0)
        return SmallCNN(momentum=0.9) if images else MLPClassifier(hidden=(32,), momentum=0.9)

    plain = _fit(model(), reuse=False, images=images)
    assert not calls
    reused = _fit(model(), reuse=True, images=images)
    assert reused.executor == "loop" and len(calls) == 3 * 6  # every client turn of the 3 rounds
    _assert_close_runs(plain, reused)
    initial = lf.ClusteredModule(model(), 3).state_dict()  # and the run trained
    assert any(not torch.equal(initial[n], t) for n, t in reused.state_dict().items())


def test_the_first_steps_loss_is_the_fresh_forwards(monkeypatch) -> None:
    """For the E-step's weights, step 0's objective from the kept forward is the one a fresh
    forward of the step's rows gives, bit for bit (and so its gradient: the same operations)."""
    checked = []

    plain = loop.plan_loss

    def plan_loss(module, plan, trained, x, y, weights, size, anchors, logits=None, losses=None):
        total = plain(module, plan, trained, x, y, weights, size, anchors, logits, losses)
        if losses is not None:
            assert torch.equal(total, plain(module, plan, trained, x, y, weights, size, anchors))
            checked.append(1)
        return total

    monkeypatch.setattr(loop, "plan_loss", plan_loss)
    torch.manual_seed(0)
    _fit(MLPClassifier(hidden=(32,), momentum=0.9), reuse=True, rounds=2)
    assert len(checked) == 2 * 6  # step 0 of every turn, not step 1


@pytest.mark.parametrize(
    "options",
    [{}, {"local_epochs": 1, "local_steps": None}, {"optimizer_state": "persist"}],
    ids=["steps", "epochs", "persist"],
)
def test_the_vectorised_executor_with_the_option_equals_it_without_and_the_loop_with_it(
    monkeypatch, options
) -> None:
    calls = []
    monkeypatch.setattr(
        vectorized, "chunk_reused_pass", lambda *a: calls.append(1) or estep_reuse.chunk_reused_pass(*a)
    )
    runs = {}
    for executor, reuse in (("vectorized", False), ("vectorized", True), ("loop", True)):
        torch.manual_seed(0)
        model = MLPClassifier(hidden=(32,), momentum=0.9)
        runs[executor, reuse] = _fit(model, reuse, executor, clients_per_chunk=4, **options)
        assert runs[executor, reuse].executor == executor
    assert len(calls) == 3 * 2  # every chunk (4 and 2 of the 6 clients) of the 3 rounds
    _assert_close_runs(runs["vectorized", False], runs["vectorized", True])
    _assert_close_runs(runs["loop", True], runs["vectorized", True])


def test_the_option_leaves_autos_choice() -> None:
    for reuse in (False, True):
        torch.manual_seed(0)
        assert _fit(MLPClassifier(hidden=(32,)), reuse, "auto", rounds=1).executor == "vectorized"


class DropoutMLP(MLPClassifier):
    def __init__(self) -> None:
        super().__init__(hidden=(16,))
        self.net = nn.Sequential(nn.Linear(64, 16), nn.Dropout(0.1), nn.Linear(16, 10))


class NormMLP(MLPClassifier):
    def __init__(self) -> None:
        super().__init__(hidden=(16,))
        self.net = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))


def test_bad_values_and_invalid_uses_are_refused_naming_the_option() -> None:
    with pytest.raises(TypeError, match="reuse_estep_forward must be True or False"):
        lf.FedRCStrategy(3, reuse_estep_forward="yes")
    assert Execution(reuse_estep_forward=True).reuse_estep_forward
    for model, layer in ((DropoutMLP(), "net.1"), (NormMLP(), "net.1")):
        with pytest.raises(ValueError, match=rf"has {layer} .*set reuse_estep_forward=False"):
            estep_reuse.check_estep_reuse(FedRC(3), model)
    personal = lf.FedSoftStrategy(3).algorithm
    with pytest.raises(ValueError, match="personal model.*set reuse_estep_forward=False"):
        estep_reuse.check_estep_reuse(personal, MLPClassifier())
    estep_reuse.check_estep_reuse(FedRC(3), SmallCNN())  # a plain CNN is accepted


def test_a_fit_with_a_mode_dependent_model_is_refused_before_training() -> None:
    strategy = lf.FedRCStrategy(
        3, clients_per_round=4, local_steps=1, executor="loop", reuse_estep_forward=True
    )
    with pytest.raises(ValueError, match="net.1 .*reuse_estep_forward=False"):
        make_trainer(strategy, max_epochs=1).fit(
            DropoutMLP(), datamodule=DigitsFederated(num_clients=4, seed=0)
        )


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_a_resumed_run_with_the_option_ends_where_the_straight_one_does(tmp_path, executor) -> None:
    dm = DigitsFederated(num_clients=12, concepts=3, seed=0)

    def run(rounds: int, **options):
        strategy = lf.FedRCStrategy(
            3, clients_per_round=4, local_steps=2, seed=3, executor=executor, reuse_estep_forward=True
        )
        return make_trainer(strategy, max_epochs=rounds, limit_val_batches=0, **options)

    torch.manual_seed(0)
    straight = run(4)
    straight.fit(MLPClassifier(lr=0.2, momentum=0.9), datamodule=dm)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    torch.manual_seed(0)
    run(2, enable_checkpointing=True, callbacks=[checkpoint]).fit(
        MLPClassifier(lr=0.2, momentum=0.9), datamodule=dm
    )
    torch.manual_seed(0)
    resumed = run(4)
    resumed.fit(MLPClassifier(lr=0.2, momentum=0.9), datamodule=dm, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.current_epoch == 4 and resumed.lightning_module.executor == executor
    assert_same_fit(straight, resumed)
