"""The K trained cluster models as the user's own LightningModule: a detached copy of one cluster
(``cluster_module``) and one Lightning-format checkpoint per cluster (``export_clusters``) that
the user's class loads with its own ``load_from_checkpoint``, hyper-parameters included."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import attached_trainer
from lightning_fedcluster.lightning_internals import hparams_name

EXPORT_KEY = "fedcluster_export"  # what the exported checkpoint records about its cluster


def detached_copy(module: pl.LightningModule) -> pl.LightningModule:
    """A deep copy of ``module`` without its trainer (the trainer is neither copied nor attached)."""
    trainer = attached_trainer(module)
    clone = copy.deepcopy(module, memo={id(trainer): None} if trainer is not None else {})
    clone.trainer = None
    return clone


def lightning_checkpoint(model: pl.LightningModule, extra: dict[str, Any]) -> dict[str, Any]:
    """What ``Trainer.save_checkpoint`` writes that ``load_from_checkpoint`` reads: the version,
    the weights and the hyper-parameters saved by ``save_hyperparameters`` (then the model's own
    ``on_save_checkpoint`` hook), without optimizer or loop state."""
    checkpoint: dict[str, Any] = {
        "pytorch-lightning_version": pl.__version__,
        "state_dict": model.state_dict(),
    }
    if model.hparams:
        name = hparams_name(model)
        if name is not None:
            checkpoint[model.CHECKPOINT_HYPER_PARAMS_NAME] = name
        checkpoint[model.CHECKPOINT_HYPER_PARAMS_KEY] = dict(model.hparams)
    checkpoint.update(extra)
    model.on_save_checkpoint(checkpoint)
    return checkpoint


def active_clusters(state: ClientState | None, num_clusters: int) -> list[int]:
    """The clusters alive: all K, except FedRC's removed clusters and CFL's clusters not yet split
    off (all K before a client store exists)."""
    if state is None:
        return list(range(num_clusters))
    return [int(k) for k in state.active.nonzero().flatten()]


def cluster_module(models: Sequence[pl.LightningModule], active: list[int], k: int) -> pl.LightningModule:
    """A detached copy of cluster model ``k``; an index out of range or an inactive cluster is refused."""
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(models):
        raise ValueError(f"k must be a cluster index in 0..{len(models) - 1}, got {k!r}")
    if k not in active:
        raise ValueError(
            f"cluster {k} is inactive (removed during training, or a CFL cluster never split off); "
            f"the active clusters are {active}"
        )
    return detached_copy(models[k])


def export_clusters(
    models: Sequence[pl.LightningModule], active: list[int], directory: str | Path, global_rank: int = 0
) -> dict[int, Path]:
    """Write ``cluster_{k}.ckpt`` for every active cluster into ``directory`` (rank 0 only; the
    inactive ones are skipped with a warning). Returns {k: path} of the active ones."""
    directory = Path(directory)
    skipped = [k for k in range(len(models)) if k not in active]
    if skipped:
        warnings.warn(
            f"export_clusters skips clusters {skipped}: they are inactive (removed, or never split off)",
            stacklevel=3,  # the caller of ClusteredModule.export_clusters
        )
    paths = {k: directory / f"cluster_{k}.ckpt" for k in active}
    if global_rank != 0:
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    for k, path in paths.items():
        model = cluster_module(models, active, k)
        extra = {EXPORT_KEY: {"cluster": k, "num_clusters": len(models)}}
        torch.save(lightning_checkpoint(model, extra), path)
    return paths
