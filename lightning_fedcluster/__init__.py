"""lightning-fedcluster: clustered and soft-clustered federated learning for PyTorch Lightning."""

from lightning_fedcluster.algorithms.discovery.policy import ConceptDiscovery
from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.module import ClusteredModule
from lightning_fedcluster.strategies import (
    CFLStrategy,
    DFedEMStrategy,
    FedAvgStrategy,
    FedEMStrategy,
    FederatedStrategy,
    FedProxStrategy,
    FedRCStrategy,
    FedSoftStrategy,
    FeSEMStrategy,
    IFCAStrategy,
    WeCFLStrategy,
)

__all__ = [
    "CFLStrategy",
    "DFedEMStrategy",
    "ClusteredModule",
    "ConceptDiscovery",
    "FedAvgStrategy",
    "FedEMStrategy",
    "FedProxStrategy",
    "FedRCStrategy",
    "FedSoftStrategy",
    "FeSEMStrategy",
    "FederatedDataModule",
    "FederatedStrategy",
    "IFCAStrategy",
    "WeCFLStrategy",
]
__version__ = "0.1.0"
