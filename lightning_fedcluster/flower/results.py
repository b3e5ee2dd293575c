"""A Flower run loaded back: the server's ``save-path`` file (``FlowerServer.save``) as the
``ClusteredModule`` that ``Trainer(strategy=<the run's strategy>).test`` / ``.predict`` use.

The file holds the K global models, the server's client store (ω, label sums, participation,
alive clusters and the entries the server owns), the round metrics and the dropped and rejected
clients, with a content hash that ``read_run`` checks (a changed byte is refused by name); the
architecture comes from the user's LightningModule and K, the seed and the rule from the strategy
the run trained with, so both are given and checked against the file. Participating clients are
scored with their own ω, unseen clients adapted by the rule, as after a Lightning fit.
"""

from __future__ import annotations

import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.checkpoint import saved_num_clusters
from lightning_fedcluster.engine.verified_files import last_good_note, verify
from lightning_fedcluster.flower.node import built
from lightning_fedcluster.flower.support import clustered_module

RUN_KEYS = ("state_dict", "client_state", "metrics", "dropped")
STORE_KEYS = ("omega", "label_sums", "seen")
WHERE = (
    "the save-path of a Flower run (run config save-path, FlowerApps(save_path=...) or "
    "simulate(save_path=...))"
)
LIGHTNING = "; this is a Lightning checkpoint: trainer.test(module, datamodule=dm, ckpt_path=path)"


@dataclass(frozen=True)
class SavedRun:
    """The contents of a ``save-path`` file."""

    state_dict: dict[str, Tensor]
    client_state: dict[str, Tensor]
    metrics: list[dict[str, float]]  # one dict per round
    dropped: dict[int, list[int]]  # round (from 1, as logged) -> clients left out of its aggregation
    rejected: dict[int, list[int]]  # round (from 1) -> clients whose replies failed the server's checks

    @property
    def num_clusters(self) -> int:
        return int(self.client_state["omega"].shape[1])

    @property
    def num_clients(self) -> int:
        return int(self.client_state["omega"].shape[0])


def read_run(path: str | os.PathLike) -> SavedRun:
    """The ``save-path`` file at ``path``; a clear error for a missing file or any other file."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"path={str(path)!r} is not a file: give {WHERE}")
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as error:
        raise ValueError(
            f"path={str(path)!r} is not a Flower run: torch.load could not read it as one "
            f"({type(error).__name__}: {error}): a run file cut short, or another file. Give {WHERE}; a "
            "Lightning checkpoint is tested with trainer.test(module, datamodule=dm, ckpt_path=path)."
            + last_good_note(file)
        ) from error
    verify(saved, file)  # a run file whose contents changed on disk is refused
    missing = [key for key in RUN_KEYS if key not in saved] if isinstance(saved, dict) else list(RUN_KEYS)
    store = saved.get("client_state") if not missing else None
    if not missing and isinstance(store, dict):
        missing = [f"client_state.{key}" for key in STORE_KEYS if key not in store]
    if missing:
        lightning = isinstance(saved, dict) and "pytorch-lightning_version" in saved
        raise ValueError(
            f"path={str(path)!r} is not a Flower run: it lacks {missing}. Give {WHERE}"
            + (LIGHTNING if lightning else "")
        )
    rejected = dict(saved.get("rejected", {}))  # a run saved before replies were checked has none
    return SavedRun(saved["state_dict"], store, list(saved["metrics"]), dict(saved["dropped"]), rejected)


def load_run(path: str | os.PathLike, module: Any, strategy: Any) -> Any:
    """The ``ClusteredModule`` of the Flower run saved at ``path``, with its client store, for
    ``Trainer(strategy=strategy).test(loaded, datamodule=dm)`` and ``.predict``.

    Args:
        path: the run's ``save-path`` file.
        module: the LightningModule the run trained (an instance, or a zero-argument factory such
            as its class), or a ClusteredModule: it gives the architecture.
        strategy: the strategy the run trained with (K, seed, shared_layers, the rule).
    """
    from lightning_fedcluster.strategies.federated import FederatedStrategy

    if not isinstance(strategy, FederatedStrategy):
        raise TypeError(
            "strategy must be the library strategy the run trained with (e.g. "
            f"FedRCStrategy(num_clusters=3)), got {type(strategy).__name__}"
        )
    run = read_run(path)
    saved_k = saved_num_clusters({"state_dict": run.state_dict})
    if saved_k != run.num_clusters:
        raise ValueError(
            f"path={str(path)!r} is not a consistent Flower run: {saved_k} cluster models but a client store "
            f"for K={run.num_clusters}. Give {WHERE}"
        )
    if strategy.num_clusters != run.num_clusters:
        raise ValueError(
            f"the run at {str(path)!r} has K={run.num_clusters} cluster models but the strategy has "
            f"num_clusters={strategy.num_clusters}: pass the strategy the run trained with "
            f"(num_clusters={run.num_clusters})"
        )
    user_module = built(module)
    clustered = clustered_module(strategy.plan, user_module)
    if clustered.num_clusters != run.num_clusters:
        raise ValueError(
            f"module is a ClusteredModule with {clustered.num_clusters} cluster models but the run has "
            f"K={run.num_clusters}: pass the plain LightningModule the run trained"
        )
    check_architecture(clustered.state_dict(), run.state_dict, type(user_module).__name__)
    clustered.load_state_dict(run.state_dict)
    store = run.client_state
    state = ClientState.initial(run.num_clients, int(store["label_sums"].shape[1]), run.num_clusters)
    state.load_state_dict(store)
    clustered.client_state = state
    clustered.round_metrics = dict(run.metrics[-1]) if run.metrics else {}
    clustered.rounds_trained = len(run.metrics)  # one entry per round: the test scores' step
    if strategy.algorithm.capabilities.personal_models and not state.personal:
        warnings.warn(
            f"the run at {str(path)!r} holds no personal models (a deployment keeps them on the nodes; "
            "simulate collects them): its participating clients are scored with the cluster models mixed "
            "by their ω, not with their personal models as after a Lightning fit",
            stacklevel=2,
        )
    return clustered


def check_architecture(expected: dict[str, Tensor], saved: dict[str, Tensor], name: str) -> None:
    """Refuse, naming the differences, saved weights that do not fit the module's cluster copies."""
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    shapes = [
        f"{key}: run {tuple(saved[key].shape)}, module {tuple(expected[key].shape)}"
        for key in sorted(set(expected) & set(saved))
        if saved[key].shape != expected[key].shape
    ]
    problems = [
        f"{label} {items[:3]}" + (f" and {len(items) - 3} more" if len(items) > 3 else "")
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shapes differ:", shapes))
        if items
    ]
    if problems:
        raise ValueError(
            f"module={name} does not have the architecture of the run's models ({'; '.join(problems)}): "
            "pass the LightningModule the run trained, built with the same arguments (and the same "
            "shared_layers in the strategy)"
        )
