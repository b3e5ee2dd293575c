"""Ready-made federated data sets, each a `FederatedDataModule` subclass.

`DigitsFederated` (scikit-learn's digits, embedded), `FashionMNISTFederated` / `CIFAR10Federated`
/ `CIFAR100Federated` (torchvision, the `vision` extra, imported only when built),
`CSVFederated` (any CSV table, time-drift concepts), and the synthetic benchmarks of the FedEM
(`FedEMSynthetic`) and FedSoft (`FedSoftSynthetic`) papers.
"""

from __future__ import annotations

from lightning_fedcluster.datamodules.datasets.digits import DigitsFederated
from lightning_fedcluster.datamodules.datasets.fedem_synthetic import FedEMSynthetic
from lightning_fedcluster.datamodules.datasets.fedsoft_synthetic import FedSoftSynthetic
from lightning_fedcluster.datamodules.datasets.tabular import CSVFederated
from lightning_fedcluster.datamodules.datasets.vision import (
    CIFAR10Federated,
    CIFAR100Federated,
    FashionMNISTFederated,
)

__all__ = [
    "CIFAR100Federated",
    "CIFAR10Federated",
    "CSVFederated",
    "DigitsFederated",
    "FashionMNISTFederated",
    "FedEMSynthetic",
    "FedSoftSynthetic",
]
