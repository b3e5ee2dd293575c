"""flower/__init__.py: the Flower entry points are importable from ``lightning_fedcluster.flower``,
and without the ``flower`` extra the import fails with the install command."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import lightning_fedcluster.flower as flower
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.flower.apps import FlowerApps
from lightning_fedcluster.flower.simulation import simulate


def test_the_public_names_are_the_modules_own():
    names = ["FlowerApps", "NodeConfigError", "SavedRun", "TrainingPlan", "check_supported", "load_run"]
    assert sorted(flower.__all__) == [*names, "read_run", "simulate"]
    assert (
        flower.FlowerApps is FlowerApps
        and flower.simulate is simulate
        and flower.TrainingPlan is TrainingPlan
    )


def test_without_flwr_the_import_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)  # what an environment without flwr looks like
    spec = importlib.util.spec_from_file_location("flower_without_flwr", flower.__file__)
    with pytest.raises(ImportError, match=r'needs Flower: pip install "lightning-fedcluster\[flower\]"'):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
