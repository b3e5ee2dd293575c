"""FashionMNIST / CIFAR-10 / CIFAR-100 datamodules, loaded by torchvision from small files written
in its on-disk formats (download=False; no network), and their `preset="authors"` (the FedRC
authors' client mix, on stand-in tensors)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import shifts
from lightning_fedcluster.datamodules.datasets.vision import (
    CIFAR10Federated,
    CIFAR100Federated,
    FashionMNISTFederated,
    load_vision_tensors,
)
from lightning_fedcluster.datamodules.shifts import CIFAR10_C, FASHION_MNIST_C, label_map
from tests.conftest import NEEDS_VISION
from tests.datamodules.partition.test_counts import type_counts
from tests.helpers.vision_files import accept_small_cifar, write_cifar10, write_cifar100, write_fashion_mnist


@pytest.fixture(scope="module")
def tv():
    return pytest.importorskip("torchvision", reason=NEEDS_VISION)


@pytest.fixture(scope="module")
def fmnist_root(tmp_path_factory, tv):
    return write_fashion_mnist(tmp_path_factory.mktemp("fmnist"), n_train=600, n_test=100)


@pytest.fixture
def cifar_root(tmp_path_factory, tv, monkeypatch):
    accept_small_cifar(monkeypatch)
    root = tmp_path_factory.mktemp("cifar")
    write_cifar10(root, per_batch=60, n_test=50)
    write_cifar100(root, n_train=400, n_test=100)
    return root


def test_fashion_mnist_tensors_match_the_files(fmnist_root) -> None:
    x, y = load_vision_tensors("fashion_mnist", fmnist_root, train=True)
    assert x.shape == (600, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.long
    raw = (fmnist_root / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").read_bytes()[16:]
    expected = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).reshape(600, 1, 28, 28).copy())
    assert torch.equal((x * 255).round().to(torch.uint8), expected)
    labels = (fmnist_root / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte").read_bytes()[8:]
    assert y.tolist() == list(labels)
    assert load_vision_tensors("fashion_mnist", fmnist_root, train=False)[1].numel() == 100


def test_fashion_mnist_scenario(fmnist_root) -> None:
    dm = FashionMNISTFederated(root=str(fmnist_root), num_clients=20, batch_size=16, seed=0)
    assert dm.num_clients == 20 and dm.num_classes == 10 and dm.batch_size == 16
    assert dm.train_x.shape[1:] == (1, 28, 28)
    # the whole training set
    assert int(dm.train_sizes.sum() + dm.val_sizes.sum() + dm.test_sizes.sum()) == 600
    assert torch.bincount(dm.metadata.concept).tolist() == [10, 5, 5]  # 50/25/25
    styles = dm.metadata.feature_style
    corrupted = [s for s in styles if s != "clean"]
    assert len(corrupted) == 4 + 1 + 1  # 40% of concept 0, 20% of the others
    assert all(s.split(":")[0] in FASHION_MNIST_C for s in corrupted)
    # Global clients: the official test set, clean, one per concept with its label map.
    test_x, test_y = load_vision_tensors("fashion_mnist", fmnist_root, train=False)
    assert dm.num_global_clients == 3
    for g in range(3):
        gx, gy = dm.global_split(g)
        assert torch.equal(gx, test_x) and torch.equal(gy, label_map(g, 10)[test_y])
    assert dm.hparams["num_clients"] == 20


def test_subsets_and_determinism(fmnist_root) -> None:
    kwargs = dict(root=str(fmnist_root), num_clients=10, samples_per_client=30, global_test_size=40)
    dm = FashionMNISTFederated(**kwargs, seed=1)
    assert int(dm.train_sizes.sum() + dm.val_sizes.sum() + dm.test_sizes.sum()) == 300
    assert dm.global_split(0)[0].shape[0] == 40
    assert torch.bincount(dm.global_split(0)[1], minlength=10).tolist() == [4] * 10  # stratified
    again = FashionMNISTFederated(**kwargs, seed=1)
    other = FashionMNISTFederated(**kwargs, seed=2)
    assert torch.equal(dm.train_x, again.train_x) and torch.equal(dm.train_y, again.train_y)
    assert not torch.equal(dm.train_y, other.train_y)
    with pytest.raises(ValueError, match="samples_per_client"):
        FashionMNISTFederated(root=str(fmnist_root), num_clients=10, samples_per_client=61)
    with pytest.raises(ValueError, match="global_test_size=101 exceeds the 100 test images"):
        FashionMNISTFederated(root=str(fmnist_root), num_clients=10, global_test_size=101)


def test_cifar10_with_copies_and_the_cifar_family(cifar_root) -> None:
    x, y = load_vision_tensors("cifar10", cifar_root)
    assert x.shape == (300, 3, 32, 32) and y.shape == (300,)
    dm = CIFAR10Federated(root=str(cifar_root), num_clients=12, copies=2, corrupt_fraction=0.9, seed=0)
    assert int(dm.train_sizes.sum() + dm.val_sizes.sum() + dm.test_sizes.sum()) == 600
    assert dm.train_x.shape[1:] == (3, 32, 32) and dm.num_global_clients == 3
    kinds = {s.split(":")[0] for s in dm.metadata.feature_style if s != "clean"}
    assert kinds and kinds <= set(CIFAR10_C)
    assert dm.train_x.min() >= 0 and dm.train_x.max() <= 1


def test_cifar100_fine_labels(cifar_root) -> None:
    dm = CIFAR100Federated(root=str(cifar_root), num_clients=8, corrupt_fraction=0, seed=0)
    assert dm.num_classes == 100 and dm.num_global_clients == 3
    _, y = load_vision_tensors("cifar100", cifar_root, train=False)
    assert torch.equal(dm.global_split(1)[1], 99 - y)


def test_missing_files_say_how_to_get_them(tmp_path, tv) -> None:
    with pytest.raises(FileNotFoundError, match="download=True"):
        FashionMNISTFederated(root=str(tmp_path), num_clients=4)
    with pytest.raises(ValueError, match="name must be one of"):
        load_vision_tensors("mnist", tmp_path)


def test_without_torchvision_the_error_names_the_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(ImportError, match=r"lightning-fedcluster\[vision\]"):
        FashionMNISTFederated(root=str(tmp_path), num_clients=4)


def fake_vision(channels: int, side: int, n_train: int = 600, n_test: int = 100):
    """Stands in for `load_vision_tensors` (torchvision is optional): class-balanced images."""

    def load(name: str, root: object = "data", *, train: bool = True, download: bool = False):
        n = n_train if train else n_test
        y = torch.arange(n) % 10
        x = (
            torch.rand(n, channels, side, side, generator=torch.Generator().manual_seed(n)) * 0.5
            + y.view(-1, 1, 1, 1) / 20
        )
        return x, y

    return load


def test_fashion_mnist_preset_uses_the_whole_training_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fedcluster.datamodules import FashionMNISTFederated
    from lightning_fedcluster.datamodules.datasets import vision

    monkeypatch.setattr(vision, "load_vision_tensors", fake_vision(1, 28))
    dm = FashionMNISTFederated(num_clients=30, preset="authors", seed=0)
    sizes = dm.train_sizes + dm.val_sizes + dm.test_sizes
    assert sizes.tolist() == [20] * 30  # 600 // 30, as their 60000 // 300
    assert (dm.val_sizes + dm.test_sizes).tolist() == [2] * 30  # test_fraction 0.1 under the preset
    styles = dm.metadata.feature_style
    corrupted = np.array([s != "clean" for s in styles])
    assert type_counts(dm.metadata.concept.numpy(), corrupted) == [6, 6, 6, 6, 3, 3]
    assert all(s.split(":")[0] in shifts.AUTHORS_FASHION_MNIST_C for s in styles if s != "clean")
    assert dm.num_global_clients == 3 and dm.hparams["preset"] == "authors"
    assert dm.adapt_fraction == 0.9  # their loader fits global clients on 90 %, scores 10 %
    adapt = dm.evaluation_split("test", "global_adapt")[1].numel()
    score = dm.evaluation_split("test", "global_score")[1].numel()
    assert adapt == 9 * score
    paper = FashionMNISTFederated(num_clients=30, seed=0)  # the paper's mix and splits
    assert (paper.val_sizes + paper.test_sizes).sum() > (dm.val_sizes + dm.test_sizes).sum()
    with pytest.raises(ValueError, match="corrupt_fraction must be left unset"):
        FashionMNISTFederated(num_clients=30, preset="authors", corrupt_fraction=0.3)


def test_cifar10_preset_triples_the_training_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fedcluster.datamodules import CIFAR10Federated, scenario_clients
    from lightning_fedcluster.datamodules.datasets import vision

    monkeypatch.setattr(vision, "load_vision_tensors", fake_vision(3, 32, n_train=200))
    kinds: list[str] = []
    record = lambda images, kind, severity, g: kinds.append(kind) or images  # noqa: E731
    monkeypatch.setattr(scenario_clients, "corrupt", record)
    dm = CIFAR10Federated(num_clients=20, preset="authors", seed=0)
    assert (dm.train_sizes + dm.val_sizes + dm.test_sizes).tolist() == [30] * 20  # 3 * 200 // 20
    assert len(kinds) == 4 + 2 * 2 and set(kinds) <= set(shifts.AUTHORS_CIFAR10_C)  # int(.2M) + 2 int(.1M)
    one_copy = CIFAR10Federated(num_clients=20, preset="authors", copies=1, seed=0)
    assert (one_copy.train_sizes + one_copy.val_sizes + one_copy.test_sizes).tolist() == [10] * 20
