"""Federated data: clients' splits, scenario construction (label/feature/concept shift)."""

from lightning_fedcluster.datamodules.digits import DigitsFederated
from lightning_fedcluster.datamodules.federated import ClientMetadata, FederatedDataModule

__all__ = ["ClientMetadata", "DigitsFederated", "FederatedDataModule"]
