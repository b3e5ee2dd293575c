"""Federated strategies: one thin subclass of FederatedStrategy per algorithm, registered by name."""

import difflib
from typing import Any

from lightning.pytorch.strategies import StrategyRegistry

from lightning_fedcluster.strategies.cfl import CFLStrategy
from lightning_fedcluster.strategies.dfedem import DFedEMStrategy
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.fedprox import FedAvgStrategy, FedProxStrategy
from lightning_fedcluster.strategies.fedrc import FedEMStrategy, FedRCStrategy
from lightning_fedcluster.strategies.fedsoft import FedSoftStrategy
from lightning_fedcluster.strategies.fesem import FeSEMStrategy, WeCFLStrategy
from lightning_fedcluster.strategies.ifca import IFCAStrategy

_REGISTRY = {
    "fedrc": (FedRCStrategy, "FedRC with three clusters"),
    "fedem": (FedEMStrategy, "FedEM with three components"),
    "dfedem": (DFedEMStrategy, "decentralised FedEM with three components"),
    "ifca": (IFCAStrategy, "IFCA with three clusters"),
    "fesem": (FeSEMStrategy, "FeSEM with three clusters"),
    "wecfl": (WeCFLStrategy, "WeCFL with three clusters"),
    "fedsoft": (FedSoftStrategy, "FedSoft with two clusters"),
    "cfl": (CFLStrategy, "CFL with up to four clusters"),
    "fedavg": (FedAvgStrategy, "FedAvg"),
    "fedprox": (FedProxStrategy, "FedProx with mu=0.01"),
}
for _name, (_cls, _description) in _REGISTRY.items():
    if _name not in StrategyRegistry:
        StrategyRegistry.register(_name, _cls, description=_description)


def registered_name(strategy: Any) -> Any:
    """The registered name of a library strategy given by its class name (``"IFCAStrategy"``, or
    dotted: ``"lightning_fedcluster.IFCAStrategy"``), else ``strategy`` unchanged. On the command
    line ``--trainer.strategy IFCAStrategy`` alone reaches the trainer as that string (jsonargparse
    builds the class only when one of its arguments follows); it means the class with its defaults,
    which is what its registered name builds."""
    if not isinstance(strategy, str):
        return strategy
    leaf = strategy.rsplit(".", 1)[-1]
    module = strategy.rsplit(".", 1)[0] if "." in strategy else "lightning_fedcluster"
    if not module.startswith("lightning_fedcluster"):
        return strategy
    for name, (cls, _) in _REGISTRY.items():
        if cls.__name__ == leaf:
            return name
    return strategy


def check_strategy_name(strategy: Any) -> None:
    """A strategy given by name must be registered; an unknown name is refused suggesting the
    library's names (Lightning's own error lists only its DDP-style choices)."""
    if not isinstance(strategy, str) or strategy.lower() == "auto" or strategy.lower() in StrategyRegistry:
        return
    close = difflib.get_close_matches(strategy.lower(), list(_REGISTRY), n=2, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise ValueError(
        f"strategy={strategy!r} is not a registered strategy: {hint}lightning-fedcluster's are "
        f"{', '.join(_REGISTRY)} (e.g. --trainer.strategy fedrc, or a class: --trainer.strategy "
        "FedRCStrategy --trainer.strategy.num_clusters 3)"
    )


__all__ = [
    "CFLStrategy",
    "DFedEMStrategy",
    "FedAvgStrategy",
    "FedEMStrategy",
    "FedProxStrategy",
    "FedRCStrategy",
    "FedSoftStrategy",
    "FeSEMStrategy",
    "FederatedStrategy",
    "IFCAStrategy",
    "WeCFLStrategy",
]
