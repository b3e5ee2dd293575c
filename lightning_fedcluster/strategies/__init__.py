"""Federated strategies: one thin subclass of FederatedStrategy per algorithm."""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.fedrc import FedRCStrategy

if "fedrc" not in StrategyRegistry:
    StrategyRegistry.register("fedrc", FedRCStrategy, description="FedRC with three clusters")

__all__ = ["FederatedStrategy", "FedRCStrategy"]
