"""lightning_fedcluster/__init__.py: the package's front door exports the module, the datamodule
and every strategy, and its ``__version__`` is the one ``pyproject.toml`` publishes."""

from __future__ import annotations

import re
from pathlib import Path

import lightning_fedcluster as lf
from lightning_fedcluster.strategies import FederatedStrategy

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_the_published_one():
    published = re.search(
        r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M
    )
    assert lf.__version__ == published.group(1)


def test_the_front_door_names_the_module_the_datamodule_and_every_strategy():
    strategies = {name for name in lf.__all__ if name.endswith("Strategy")}
    assert set(lf.__all__) == strategies | {"ClusteredModule", "FederatedDataModule", "ConceptDiscovery"}
    assert all(issubclass(getattr(lf, name), FederatedStrategy) for name in strategies)
    names = {getattr(lf, name).strategy_name for name in strategies}
    assert names == {"federated", "fedrc", "fedem", "dfedem", "fedsoft", "ifca", "fesem", "wecfl", "cfl",
                     "fedavg", "fedprox"}  # fmt: skip
