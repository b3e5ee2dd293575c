"""lightning-fedcluster: clustered and soft-clustered federated learning for PyTorch Lightning."""

from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.module import ClusteredModule
from lightning_fedcluster.strategies import FederatedStrategy, FedRCStrategy

__all__ = ["ClusteredModule", "FederatedDataModule", "FederatedStrategy", "FedRCStrategy"]
__version__ = "0.1.0"
