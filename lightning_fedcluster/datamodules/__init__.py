"""Federated data: clients' splits, scenario construction (label/feature/concept shift), data sets.

The vision datamodules import torchvision (the `vision` extra) only when they are built.
"""

from lightning_fedcluster.datamodules import partition, shifts
from lightning_fedcluster.datamodules.digits import DigitsFederated
from lightning_fedcluster.datamodules.federated import (
    ClientMetadata,
    FederatedDataModule,
    build_clients,
    build_scenario,
    dataset_to_tensors,
)
from lightning_fedcluster.datamodules.fedsoft_synthetic import FedSoftSynthetic
from lightning_fedcluster.datamodules.summary import client_rows, format_summary, summary_figure
from lightning_fedcluster.datamodules.synthetic import FedEMSynthetic
from lightning_fedcluster.datamodules.tabular import CSVFederated
from lightning_fedcluster.datamodules.tensor_file import TensorFileFederated
from lightning_fedcluster.datamodules.vision import (
    CIFAR10Federated,
    CIFAR100Federated,
    FashionMNISTFederated,
)

__all__ = [
    "CIFAR100Federated",
    "CIFAR10Federated",
    "CSVFederated",
    "ClientMetadata",
    "DigitsFederated",
    "FashionMNISTFederated",
    "FedEMSynthetic",
    "FedSoftSynthetic",
    "FederatedDataModule",
    "TensorFileFederated",
    "build_clients",
    "build_scenario",
    "client_rows",
    "dataset_to_tensors",
    "format_summary",
    "partition",
    "shifts",
    "summary_figure",
]
