"""The K trained cluster models as the user's own LightningModule: a detached copy of one cluster
(``cluster_module``) and one Lightning-format checkpoint per cluster (``export_clusters``) that
the user's class loads with its own ``load_from_checkpoint``, hyper-parameters included."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_fedcluster.engine.copies import attached_trainer
from lightning_fedcluster.engine.host import TrainingHost
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


class ClusterExport:
    """The ClusteredModule's export API (a mixin over its cluster copies ``models``)."""

    def active_clusters(self: TrainingHost) -> list[int]:
        """The clusters alive: all K, except FedRC's removed clusters and CFL's clusters not yet split off."""
        if self.client_state is None:
            return list(range(self.num_clusters))
        return [int(k) for k in self.client_state.active.nonzero().flatten()]

    def cluster_module(self: TrainingHost, k: int) -> pl.LightningModule:
        """Cluster k's trained model as the user's LightningModule (its own class, forward,
        hyper-parameters and ``configure_optimizers``), a copy detached from the trainer on this
        module's device. With ``shared_layers`` the copy holds the shared layers too (its own copy).
        An inactive cluster (removed by FedRC's adaptive K, or a CFL cluster not split off yet) is
        refused: it holds no trained model of any client group."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.num_clusters:
            raise ValueError(f"k must be a cluster index in 0..{self.num_clusters - 1}, got {k!r}")
        active = self.active_clusters()
        if k not in active:
            raise ValueError(
                f"cluster {k} is inactive (removed during training, or a CFL cluster never split off); "
                f"the active clusters are {active}"
            )
        return detached_copy(self.models[k])

    def export_clusters(self: TrainingHost, directory: str | Path) -> dict[int, Path]:
        """Write ``cluster_{k}.ckpt`` for every active cluster k into ``directory`` (created if
        needed): Lightning checkpoints that ``MyModule.load_from_checkpoint(path)`` loads, the
        weights of cluster k and the hyper-parameters of the module you passed. Inactive clusters
        are skipped with a warning. Only global rank 0 writes. Returns {k: path} of the active ones."""
        directory = Path(directory)
        active = self.active_clusters()
        skipped = [k for k in range(self.num_clusters) if k not in active]
        if skipped:
            warnings.warn(
                f"export_clusters skips clusters {skipped}: they are inactive (removed, or never split off)",
                stacklevel=2,
            )
        paths = {k: directory / f"cluster_{k}.ckpt" for k in active}
        trainer = attached_trainer(self)
        if trainer is not None and trainer.global_rank != 0:
            return paths
        directory.mkdir(parents=True, exist_ok=True)
        for k, path in paths.items():
            model = self.cluster_module(k)
            extra = {EXPORT_KEY: {"cluster": k, "num_clusters": self.num_clusters}}
            torch.save(lightning_checkpoint(model, extra), path)
        return paths
