"""Where ``shared_layers`` and ``logits_from`` live: in the ``ClusteredModule``. They describe its
K copies (which submodules are tied across them; where the logits are in their output) and hold
for a prediction or an export without any strategy, so the engine reads them from the module.

A strategy's keywords of the same names (for the CLI and for a plain LightningModule) are the
arguments of the ClusteredModule it builds around a plain module, kept as ``ModuleOptions`` until
it connects one; given a ClusteredModule already built, a strategy that sets them too is refused by
name: a setting has one home, never two values to reconcile. The same holds for the Flower apps."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from lightning_fedcluster.engine.outputs import LogitsFrom, check_logits_from

if TYPE_CHECKING:
    import lightning.pytorch as pl


@dataclass(frozen=True)
class ModuleOptions:
    """The arguments of the ClusteredModule a strategy builds around a plain LightningModule:
    ``shared_layers`` (dotted names of submodules shared by the K copies) and ``logits_from``
    (where the logits are in a dict/tuple forward)."""

    shared_layers: tuple[str, ...] = ()
    logits_from: LogitsFrom = None

    def __post_init__(self) -> None:
        layers = self.shared_layers
        object.__setattr__(self, "shared_layers", (layers,) if isinstance(layers, str) else tuple(layers))
        object.__setattr__(self, "logits_from", check_logits_from(self.logits_from))

    def given(self) -> list[str]:
        """The options set to something other than their defaults, as ``name=value``."""
        return [
            f"{item.name}={getattr(self, item.name)!r}"
            for item in fields(self)
            if getattr(self, item.name) != item.default
        ]


def clustered_module(
    module: pl.LightningModule, num_clusters: int, seed: int, options: ModuleOptions, owner: str
) -> Any:
    """``module`` itself when it is a ClusteredModule (refusing ``options`` that ``owner`` was also
    given: they are the module's), else the ClusteredModule of K copies of it built with ``seed``
    and ``options``."""
    from lightning_fedcluster.module import ClusteredModule

    if not isinstance(module, ClusteredModule):
        return ClusteredModule(
            module,
            num_clusters,
            seed=seed,
            shared_layers=options.shared_layers,
            logits_from=options.logits_from,
        )
    given = options.given()
    if given:
        raise ValueError(
            f"{owner} was given {', '.join(given)} but the module is a ClusteredModule, where these "
            f"settings live (module.shared_layers={module.shared_layers!r}, module.logits_from="
            f"{module.logits_from!r}): pass them to ClusteredModule(...), or give {owner} the plain "
            "LightningModule to wrap"
        )
    return module
