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
    return FederatedDataModule([s for s in splits], [(x[:2], y[:2]) for x, y in splits], num_classes=CLASSES,
                               batch_size=8)


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
    elif isinstance(value, nn.Module) or dataclasses.is_dataclass(value) or (
        type(value).__module__.startswith("lightning_fedcluster") and hasattr(value, "__dict__")
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
    data_ptrs = {t.untyped_storage().data_ptr() for t in (dm.train_x, dm.train_y, dm.test_x, dm.test_y,
                                                             dm.global_x, dm.global_y) if t.numel()}
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
