"""FashionMNIST, CIFAR-10 and CIFAR-100 as FedRC scenarios (paper App. H.8), via torchvision.

torchvision is the optional `vision` extra: it is imported only when one of these datamodules is
built. The clients share the official training set (Dirichlet label skew, client types with the
paper's proportions, one corruption of the family per corrupted client); the global test clients
(one per concept) are the official test set with each concept's label map, as in the paper.
Inputs are float images [N, C, H, W] in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.datamodules import partition
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.scenario import build_scenario
from lightning_fedcluster.datamodules.scenario_arguments import preset_evaluation_fractions
from lightning_fedcluster.datamodules.shifts import CIFAR10_C, FASHION_MNIST_C
from lightning_fedcluster.datamodules.validation import check_batch_size, int_arg

__all__ = [
    "CIFAR100Federated",
    "CIFAR10Federated",
    "FashionMNISTFederated",
    "load_vision_tensors",
]

_DATASETS = {
    # name: (torchvision class name, number of classes, folder torchvision reads under root)
    "fashion_mnist": ("FashionMNIST", 10, "FashionMNIST/raw"),
    "cifar10": ("CIFAR10", 10, "cifar-10-batches-py"),
    "cifar100": ("CIFAR100", 100, "cifar-100-python"),
}


def _torchvision_datasets() -> Any:
    try:
        import torchvision.datasets
    except ImportError as error:
        raise ImportError(
            "the FashionMNIST / CIFAR datamodules load their data through torchvision, which is not "
            "installed: install the vision extra (pip install 'lightning-fedcluster[vision]')"
        ) from error
    return torchvision.datasets


def load_vision_tensors(
    name: str, root: str | Path = "data", *, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor]:
    """One split of a torchvision data set as (x float32 [N, C, H, W] in [0, 1], y int64 [N]).

    `name` is "fashion_mnist", "cifar10" or "cifar100". With `download=True` torchvision fetches
    the files into `root` (and checks their checksums) if they are missing.
    """
    if name not in _DATASETS:
        raise ValueError(f"name must be one of {', '.join(_DATASETS)}, got {name!r}")
    class_name, _, folder = _DATASETS[name]
    datasets = _torchvision_datasets()
    try:
        data = getattr(datasets, class_name)(root=str(root), train=train, download=download)
    except RuntimeError as error:
        raise FileNotFoundError(
            f"{class_name} was not found under root={str(root)!r} (torchvision looks in "
            f"{Path(root) / folder}): pass download=True to fetch it, or point root at the folder "
            f"that holds {folder}/ ({error})"
        ) from error
    images = torch.as_tensor(np.asarray(data.data))
    if images.ndim == 3:  # FashionMNIST: [N, H, W]
        images = images.unsqueeze(1)
    else:  # CIFAR: [N, H, W, C]
        images = images.permute(0, 3, 1, 2)
    x = images.contiguous().to(torch.float32) / 255.0
    y = torch.as_tensor(np.asarray(data.targets), dtype=torch.long)
    return x, y


def _build(
    name: str,
    *,
    root: str | Path,
    download: bool,
    num_clients: int,
    concepts: int,
    dirichlet_alpha: float | None,
    corrupt_fraction: float | Sequence[float] | None,
    concept_proportions: Sequence[float] | None,
    samples_per_client: int | None,
    global_test_size: int | None,
    copies: int,
    test_fraction: float,
    min_client_size: int,
    corruptions: Sequence[str] | None,
    seed: int,
    preset: str | None = None,
) -> dict[str, Any]:
    """Load, subsample, replicate, then hand everything to `build_scenario`."""
    num_clients = int_arg("num_clients", num_clients, 1)
    copies = int_arg("copies", copies, 1)
    seed = int_arg("seed", seed, 0)
    if samples_per_client is not None:
        samples_per_client = int_arg("samples_per_client", samples_per_client, 1)
    if global_test_size is not None:
        global_test_size = int_arg("global_test_size", global_test_size, 1)
    x, y = load_vision_tensors(name, root, train=True, download=download)
    test_x, test_y = load_vision_tensors(name, root, train=False, download=download)
    # A stream of its own (child 5; build_scenario uses children 0-4) so the subset never
    # changes the scenario's other draws.
    subset_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(6)[5])
    if samples_per_client is not None:
        wanted = -(-num_clients * samples_per_client // copies)  # before the copies
        if wanted > y.numel():
            raise ValueError(
                f"num_clients * samples_per_client = {num_clients * samples_per_client} needs "
                f"{wanted} training images (with copies={copies}) but the training set has "
                f"{y.numel()}; use fewer clients, fewer samples_per_client or more copies"
            )
        rows = torch.from_numpy(partition.stratified_subset(y.numpy(), wanted, subset_rng))
        x, y = x[rows], y[rows]
    if global_test_size is not None:
        if global_test_size > test_y.numel():
            raise ValueError(f"global_test_size={global_test_size} exceeds the {test_y.numel()} test images")
        rows = torch.from_numpy(partition.stratified_subset(test_y.numpy(), global_test_size, subset_rng))
        test_x, test_y = test_x[rows], test_y[rows]
    if copies > 1:  # the paper triples CIFAR for MobileNetV2 so 300 clients have enough data
        x, y = x.repeat(copies, 1, 1, 1), y.repeat(copies)
    family = FASHION_MNIST_C if x.shape[1] == 1 else CIFAR10_C
    if preset is not None:  # build_scenario picks the authors' pool
        family = None
    return build_scenario(
        x,
        y,
        num_clients=num_clients,
        concepts=concepts,
        dirichlet_alpha=dirichlet_alpha,
        corrupt_fraction=corrupt_fraction,
        concept_proportions=concept_proportions,
        test_fraction=test_fraction,
        min_client_size=min_client_size,
        num_classes=_DATASETS[name][1],
        seed=seed,
        global_test=(test_x, test_y),
        corruptions=family if corruptions is None else corruptions,
        preset=preset,
    )


class FashionMNISTFederated(FederatedDataModule):
    """FashionMNIST as the FedRC scenario (paper Table 1: 300 clients, Dirichlet 1.0).

    Args:
        root: folder holding (or receiving) `FashionMNIST/raw/*-ubyte`.
        download: let torchvision download the files if missing (needs internet).
        scenario arguments: ``num_clients``, ``concepts``, ``dirichlet_alpha``,
            ``corrupt_fraction``, ``concept_proportions``, ``test_fraction``, ``min_client_size``,
            ``seed``: as in `FederatedDataModule.from_tensors`.
        samples_per_client: use a class-stratified random subset of num_clients * this many
            training images (default None: the whole training set, ~200 per client at 300).
        global_test_size: use this many test images (stratified) per global client (None: all).
        corruptions: kinds drawn for corrupted clients (default `shifts.FASHION_MNIST_C`).
        val_share, adapt_fraction: the evaluation splits (validation/test of each client's
            held-out rows, validation/test x adapt/score of the global clients), as in
            `FederatedDataModule`.
        preset: "authors" builds the client mix of the FedRC authors' make_fmnist_c.py (see
            `build_scenario`): every client 60000 // num_clients images with class shares
            ~ Dir(dirichlet_alpha * p), 40 / 30 / 30 % concepts with 50 / 33 / 33 % corrupted,
            their corruption pool; test_fraction then defaults to 0.1 and adapt_fraction to 0.9
            (their loader's 90 / 10 splits), else to 0.2 and 0.4.
    """

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        num_clients: int = 300,
        concepts: int = 3,
        dirichlet_alpha: float | None = 1.0,
        corrupt_fraction: float | Sequence[float] | None = None,
        concept_proportions: Sequence[float] | None = None,
        samples_per_client: int | None = None,
        global_test_size: int | None = None,
        test_fraction: float | None = None,
        min_client_size: int = 2,
        corruptions: Sequence[str] | None = None,
        batch_size: int = 128,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float | None = None,
        preset: str | None = None,
    ) -> None:
        check_batch_size(batch_size)
        test_fraction, adapt_fraction = preset_evaluation_fractions(preset, test_fraction, adapt_fraction)
        arguments = _build(
            "fashion_mnist",
            root=root,
            download=download,
            num_clients=num_clients,
            concepts=concepts,
            dirichlet_alpha=dirichlet_alpha,
            corrupt_fraction=corrupt_fraction,
            concept_proportions=concept_proportions,
            samples_per_client=samples_per_client,
            global_test_size=global_test_size,
            copies=1,
            test_fraction=test_fraction,
            min_client_size=min_client_size,
            corruptions=corruptions,
            seed=seed,
            preset=preset,
        )
        super().__init__(
            **arguments, batch_size=batch_size, val_share=val_share, adapt_fraction=adapt_fraction, seed=seed
        )
        self.save_hyperparameters()


class CIFAR10Federated(FederatedDataModule):
    """CIFAR-10 as the FedRC scenario (paper Table 1: 300 clients on three copies of the
    training set for MobileNetV2; 100 clients, one copy, for ResNet-18).

    Args are those of `FashionMNISTFederated` plus `copies` (how many times the training
    images are repeated before partitioning; default 1, or 3 under preset="authors" as their
    make_cifar_c.py does, so 500 images per client at 300 clients); `root` holds
    `cifar-10-batches-py/`, and `corruptions` defaults to `shifts.CIFAR10_C` (three of its kinds
    need torchvision).
    """

    _name = "cifar10"

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        num_clients: int = 300,
        concepts: int = 3,
        dirichlet_alpha: float | None = 1.0,
        corrupt_fraction: float | Sequence[float] | None = None,
        concept_proportions: Sequence[float] | None = None,
        samples_per_client: int | None = None,
        global_test_size: int | None = None,
        copies: int | None = None,
        test_fraction: float | None = None,
        min_client_size: int = 2,
        corruptions: Sequence[str] | None = None,
        batch_size: int = 128,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float | None = None,
        preset: str | None = None,
    ) -> None:
        check_batch_size(batch_size)
        test_fraction, adapt_fraction = preset_evaluation_fractions(preset, test_fraction, adapt_fraction)
        arguments = _build(
            self._name,
            root=root,
            download=download,
            num_clients=num_clients,
            concepts=concepts,
            dirichlet_alpha=dirichlet_alpha,
            corrupt_fraction=corrupt_fraction,
            concept_proportions=concept_proportions,
            samples_per_client=samples_per_client,
            global_test_size=global_test_size,
            copies=(3 if preset == "authors" else 1) if copies is None else copies,
            test_fraction=test_fraction,
            min_client_size=min_client_size,
            corruptions=corruptions,
            seed=seed,
            preset=preset,
        )
        super().__init__(
            **arguments, batch_size=batch_size, val_share=val_share, adapt_fraction=adapt_fraction, seed=seed
        )
        self.save_hyperparameters()


class CIFAR100Federated(CIFAR10Federated):
    """CIFAR-100 (fine labels, 100 classes) as the FedRC scenario; `root` holds
    `cifar-100-python/`. Arguments as `CIFAR10Federated`."""

    _name = "cifar100"
