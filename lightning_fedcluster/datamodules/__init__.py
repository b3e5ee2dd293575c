"""Federated data: clients' splits, scenario construction (label/feature/concept shift), data sets.

The core (`FederatedDataModule` in `federated`, its builders, loaders, storage, input checks and
evaluation splits) sits at this level; `partition` holds the partition functions, `shifts` the
concept label maps and image corruptions, `datasets` the ready-made data sets, and
`hugging_face` the reading of Hugging Face data sets split by Flower Datasets partitioners
(``FederatedDataModule.from_hugging_face``; the `hf` extra, imported only when used). Every public
name is importable from here. The vision datamodules import torchvision (the `vision` extra)
only when they are built.
"""

from lightning_fedcluster.datamodules import partition, shifts
from lightning_fedcluster.datamodules.clients import build_clients, dataset_to_tensors
from lightning_fedcluster.datamodules.datasets import (
    CIFAR10Federated,
    CIFAR100Federated,
    CSVFederated,
    DigitsFederated,
    FashionMNISTFederated,
    FedEMSynthetic,
    FedSoftSynthetic,
)
from lightning_fedcluster.datamodules.datasets.tensor_file import TensorFileFederated
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.metadata import ClientMetadata
from lightning_fedcluster.datamodules.scenario import build_scenario
from lightning_fedcluster.datamodules.summary import client_rows, format_summary, summary_figure

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
