"""Shared helpers for the engine tests: a quiet CPU trainer factory."""

from __future__ import annotations

import logging
import os
import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_fedcluster.datamodules import FedSoftSynthetic

warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*LeafSpec.*")
# The tests train tiny models, where intra-op threads only add overhead (and slow everything down
# badly on a loaded machine); one thread also makes results independent of the core count.
# Lightning's DDP-based strategies reset the thread count unless OMP_NUM_THREADS is set.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(name).setLevel(logging.ERROR)


NEEDS_VISION = 'needs the vision extra: pip install -e ".[vision]" (or ".[all]")'
"""The skip reason of every test that needs torchvision."""


def make_trainer(strategy, max_epochs: int, **overrides) -> pl.Trainer:
    """A CPU, one-process trainer with no progress bar; logging and checkpoints off unless asked."""
    options = dict(
        strategy=strategy, accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(overrides)
    return pl.Trainer(**options)


@pytest.fixture
def trainer_factory():
    return make_trainer


@pytest.fixture(scope="module")
def synthetic():
    """FedSoft's synthetic regression scenario, small: the regression tests' data."""
    return FedSoftSynthetic(
        num_clients=10, pattern="10:90", min_samples=40, max_samples=60, global_test_size=200, seed=0
    )
