"""The engine's memory does not grow with the number of clients beyond their data and a few
numbers of state per client: no per-client model copies (a mechanism test, no timings)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, nn

from lightning_fedcluster import FederatedDataModule, FedRCStrategy
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

K, CLASSES, FEATURES = 3, 3, 8
_SKIP = {"_trainer", "trainer", "_fabric", "_jit_is_scripting"}


def _datamodule(num_clients: int) -> FederatedDataModule:
    generator = torch.Generator().manual_seed(num_clients)
    splits = [
        (torch.randn(n, FEATURES, generator=generator), torch.randint(0, CLASSES, (n,), generator=generator))
        for n in [10] * num_clients
    ]
    return FederatedDataModule(
        [s for s in splits], [(x[:2], y[:2]) for x, y in splits], num_classes=CLASSES, batch_size=8
    )


def _walk(value: object, found: dict[tuple[int, int], Tensor], seen: set[int]) -> None:
    """Every tensor reachable from ``value`` through containers, modules, dataclasses and this
    package's objects (never through the trainer), keyed by storage."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Tensor):
        if value.is_meta:  # shape-only tensors (the vectorised executor's template) hold no memory
            return
        storage = value.untyped_storage()
        found[(storage.data_ptr(), storage.nbytes())] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in _SKIP:
                _walk(item, found, seen)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            _walk(item, found, seen)
    elif (
        isinstance(value, nn.Module)
        or dataclasses.is_dataclass(value)
        or (type(value).__module__.startswith("lightning_fedcluster") and hasattr(value, "__dict__"))
    ):
        _walk(vars(value), found, seen)


def _held(num_clients: int, clients_per_round: int | None) -> tuple[int, int, int, int]:
    """Fit one round (with evaluation); return (tensor count, bytes) of everything the module holds,
    data excluded, plus (data bytes held, datamodule data bytes) and the model's bytes."""
    dm = _datamodule(num_clients)
    strategy = FedRCStrategy(K, local_steps=1, clients_per_round=clients_per_round, seed=0)
    trainer = make_trainer(strategy, max_epochs=1, check_val_every_n_epoch=1)
    trainer.fit(MLPClassifier(in_features=FEATURES, num_classes=CLASSES, hidden=(256,)), datamodule=dm)
    module = trainer.lightning_module
    found: dict[tuple[int, int], Tensor] = {}
    _walk(module, found, set())
    data_ptrs = {
        t.untyped_storage().data_ptr()
        for t in (dm.train_x, dm.train_y, dm.test_x, dm.test_y, dm.global_x, dm.global_y)
        if t.numel()
    }
    state = {key: t for key, t in found.items() if key[0] not in data_ptrs}
    data = sum(nbytes for (ptr, nbytes) in found if ptr in data_ptrs)
    dm_bytes = sum(t.untyped_storage().nbytes() for t in (dm.train_x, dm.train_y, dm.test_x, dm.test_y))
    model_bytes = sum(p.numel() * p.element_size() for p in module.models[0].parameters())
    return len(state), sum(nbytes for (_, nbytes) in state), data - dm_bytes, model_bytes


@pytest.fixture
def one_thread(monkeypatch):
    """Tiny tensors: one thread avoids OpenMP hand-offs that crawl on a busy machine (Lightning
    resets torch's thread count from OMP_NUM_THREADS when the trainer starts)."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("clients_per_round", [10, None], ids=["10-per-round", "all-clients"])
def test_module_memory_grows_only_by_small_per_client_state(clients_per_round, one_thread):
    few_count, few_bytes, few_extra_data, model_bytes = _held(20, clients_per_round)
    many_count, many_bytes, many_extra_data, _ = _held(200, clients_per_round)
    # Same tensors (K models, global snapshots, update accumulators, client store, round buffers) ...
    assert many_count == few_count
    # ... whose growth is a few float64 per client and cluster: ω [K], label sums [C, K], flags,
    # and the round report when every client takes part; far below one model copy per client.
    per_client = (many_bytes - few_bytes) / (200 - 20)
    bound = 4 * 8 * (K + CLASSES * K + 2)
    assert per_client <= bound, (per_client, bound)
    assert bound < model_bytes / 10
    # Client data is held once (the datamodule's tensors, not copies per client or per round).
    assert few_extra_data == many_extra_data == 0


# -- Lightning's conventions: a round is one training batch and one step ------------------------
ROUNDS, CLIENTS_PER_ROUND, LOCAL_STEPS = 3, 4, 2


def _digits():
    from lightning_fedcluster.datamodules import DigitsFederated

    return DigitsFederated(num_clients=8, concepts=2, dirichlet_alpha=1.0, seed=0)


def _fedrc(executor: str = "loop") -> FedRCStrategy:
    return FedRCStrategy(2, local_steps=LOCAL_STEPS, clients_per_round=CLIENTS_PER_ROUND, executor=executor)


def _same_weights(one, two) -> None:
    for (name, a), b in zip(one.state_dict().items(), two.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for (name, a), b in zip(one.client_state.state_dict().items(), two.client_state.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_global_step_counts_rounds_and_checkpoints_loggers_test_and_predict_follow(executor, tmp_path):
    """One step per round on both executors: ModelCheckpoint names a file per round by it, a
    logger's rows are the rounds, and trainer.test / trainer.predict read the best checkpoint."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    dm = _digits()
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    trainer = make_trainer(
        _fedrc(executor), ROUNDS, enable_checkpointing=True, callbacks=[saver],
        logger=CSVLogger(tmp_path, name="csv"), default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(MLPClassifier(), datamodule=dm)
    assert trainer.lightning_module.executor == executor
    assert trainer.global_step == ROUNDS and trainer.current_epoch == ROUNDS
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == [f"epoch={r}-step={r + 1}.ckpt" for r in range(ROUNDS)]
    (metrics_file,) = (tmp_path / "csv").rglob("metrics.csv")
    import csv

    rows = [row for row in csv.DictReader(metrics_file.open()) if row.get("train/loss")]
    assert [int(row["step"]) for row in rows] == list(range(1, ROUNDS + 1))  # one row per round
    tested = trainer.test(datamodule=dm, verbose=False)  # ckpt_path="best": a round's checkpoint
    assert 0.0 <= tested[0]["test/global_acc"] <= 1.0
    assert trainer.predict(datamodule=dm)  # the same checkpoint, every client's predictions


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_max_steps_and_every_n_train_steps_count_rounds(executor, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    dm = _digits()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    stopped = make_trainer(_fedrc(executor), -1, max_steps=2, enable_checkpointing=True, callbacks=[saver])
    stopped.fit(MLPClassifier(), datamodule=dm)
    assert stopped.current_epoch == 2 and stopped.global_step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt"]
    whole = make_trainer(_fedrc(executor), 2)
    whole.fit(MLPClassifier(), datamodule=dm)
    _same_weights(whole.lightning_module, stopped.lightning_module)


def test_a_step_checkpoint_taken_mid_run_resumes_bit_identically(tmp_path):
    """A checkpoint written by every_n_train_steps (inside a round's epoch, after its one batch)
    is a round boundary: resuming from it equals the run that never stopped."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    dm = _digits()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    straight = make_trainer(_fedrc(), ROUNDS, enable_checkpointing=True, callbacks=[saver])
    straight.fit(MLPClassifier(), datamodule=dm)
    resumed = make_trainer(_fedrc(), ROUNDS)
    resumed.fit(MLPClassifier(), datamodule=dm, ckpt_path=tmp_path / "epoch=0-step=1.ckpt")
    assert resumed.global_step == ROUNDS and resumed.current_epoch == ROUNDS
    assert resumed.lightning_module.rounds_trained == ROUNDS
    _same_weights(straight.lightning_module, resumed.lightning_module)


def test_the_strategy_hands_itself_in_for_a_run_and_takes_itself_back():
    """The module reads its strategy only as handed in by it (never ``trainer.strategy``): after
    the fit it is gone, so a plain Trainer cannot test the module with a stale one."""
    import lightning.pytorch as pl

    dm = _digits()
    trainer = make_trainer(_fedrc(), 1)
    trainer.fit(MLPClassifier(), datamodule=dm)
    module = trainer.lightning_module
    assert module.federated is None
    assert trainer.test(module, datamodule=dm, verbose=False)[0]["test/global_acc"] >= 0.0  # handed in again
    plain = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(TypeError, match="under a federated strategy, which hands it the run"):
        plain.test(module, datamodule=dm)


def test_val_check_interval_counts_rounds():
    """With check_val_every_n_epoch=None, val_check_interval=n validates every n rounds (batches)."""
    import lightning.pytorch as pl

    class ValidatedAfter(pl.Callback):
        def __init__(self) -> None:
            self.rounds: list[int] = []

        def on_validation_end(self, trainer, pl_module) -> None:
            self.rounds.append(pl_module.rounds_trained)

    seen = ValidatedAfter()
    trainer = make_trainer(_fedrc(), 4, check_val_every_n_epoch=None, val_check_interval=2, callbacks=[seen])
    trainer.fit(MLPClassifier(), datamodule=_digits())
    assert seen.rounds == [2, 4] and trainer.global_step == 4


def test_the_module_is_a_lightning_module_composed_of_parts_not_mixins():
    """Every base class is Lightning's; the attributes users and callbacks read and write live in
    the part that owns them (``module.federation``), and no part adds weights to the state dict."""
    import lightning.pytorch as pl

    from lightning_fedcluster import ClusteredModule

    assert ClusteredModule.__bases__ == (pl.LightningModule,)
    module = ClusteredModule(MLPClassifier(hidden=(4,)), K)
    store, plan = object(), FedRCStrategy(K).plan
    module.client_state, module.rounds_trained, module.federation.plan = store, 3, plan
    assert module.federation.client_state is store and module.federation.rounds_trained == 3
    assert module.plan is plan and module.rule is plan.rule
    assert {key.split(".")[0] for key in module.state_dict()} == {"models"}
