"""Cluster copies of the user's module: independent initialisation, optional shared layers, the
federated tensors of each copy, snapshots of them, and the local solver built from the user's
configure_optimizers and its schedulers."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.seeds import CLUSTER_INIT, derive_seed
from lightning_fedcluster.engine.lr_schedulers import RoundScheduler, parse_optimizer_config


def attached_trainer(module: nn.Module) -> Any:
    """The trainer ``module`` is attached to (Lightning's public ``LightningModule.trainer``), or
    None: a plain ``nn.Module``, or a Lightning module outside a fit (where ``trainer`` raises)."""
    if not isinstance(module, pl.LightningModule):
        return None
    try:
        return module.trainer
    except RuntimeError:  # "... is not attached to a `Trainer`"
        return None


def independent_copies(module: nn.Module, num_clusters: int, seed: int) -> list[nn.Module]:
    """K deep copies of ``module``, each re-initialised with its own seed (reset_parameters).

    Identical starting models are a fixed point of the soft-clustering EM (every γ stays 1/K),
    so the copies must differ. The user's trainer is not copied along.
    """
    trainer = attached_trainer(module)
    memo: dict[int, Any] = {id(trainer): None} if trainer is not None else {}
    copies, resettable = [], False
    for k in range(num_clusters):
        clone = copy.deepcopy(module, memo=dict(memo))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, k, CLUSTER_INIT))
            for sub in clone.modules():
                if callable(getattr(sub, "reset_parameters", None)):
                    sub.reset_parameters()
                    resettable = True
        copies.append(clone)
    if num_clusters > 1 and not resettable:
        warnings.warn(
            f"{type(module).__name__} has no submodule with reset_parameters(): the {num_clusters} cluster "
            "models start identical, and soft clustering cannot separate identical models",
            stacklevel=3,
        )
    return copies


def state_tensors_of(model: nn.Module) -> list[Tensor]:
    """The tensors that are federated: parameters and floating-point buffers (e.g. BN statistics)."""
    return [p for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


@contextlib.contextmanager
def attached(model: nn.Module, trainer: Any) -> Iterator[None]:
    """``model.trainer`` set to ``trainer`` inside the block (the copies hold no trainer, but a
    user's configure_optimizers may read e.g. ``self.trainer.max_epochs``)."""
    import lightning.pytorch as pl

    if trainer is None or not isinstance(model, pl.LightningModule):
        yield
        return
    model.trainer = trainer
    try:
        yield
    finally:
        model.trainer = None


def same_settings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two parameter groups have the same hyperparameters (tensor values compared by value)."""
    keys = set(a) - {"params"}
    if keys != set(b) - {"params"}:
        return False
    for key in keys:
        if isinstance(a[key], Tensor) or isinstance(b[key], Tensor):
            if not torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])):
                return False
        elif a[key] != b[key]:
            return False
    return True


def local_solver(
    models: Sequence[nn.Module], trainer: Any = None
) -> tuple[torch.optim.Optimizer, list[RoundScheduler]]:
    """Every client's local solver: the optimizer of copy 0's configure_optimizers (the user's type,
    settings and parameter groups) with each other copy's parameters added to the matching group
    (parameters tied across copies appear once), and the schedulers configure_optimizers attached
    to it, which therefore schedule every copy."""
    import lightning.pytorch as pl

    optimizer: torch.optim.Optimizer | None = None
    schedulers: list[RoundScheduler] = []
    seen: set[int] = set()
    for model in models:
        owner = type(model).__name__
        if type(model).configure_optimizers is pl.LightningModule.configure_optimizers:
            raise TypeError(f"{owner} must define configure_optimizers: it is every client's local solver")
        with attached(model, trainer):
            template, found = parse_optimizer_config(model.configure_optimizers(), owner)
        if optimizer is None:
            optimizer, schedulers = template, found
            seen.update(id(p) for group in optimizer.param_groups for p in group["params"])
            continue
        groups = list(zip(optimizer.param_groups, template.param_groups, strict=False))
        if len(optimizer.param_groups) != len(template.param_groups) or not all(
            same_settings(a, b) for a, b in groups
        ):
            raise ValueError(
                f"{owner}.configure_optimizers gives the cluster copies different parameter groups or "
                "settings: every copy must get the same groups with the same hyperparameters"
            )
        for group, other in groups:
            params = [p for p in other["params"] if id(p) not in seen]
            seen.update(id(p) for p in params)
            group["params"].extend(params)
    assert optimizer is not None
    return optimizer, schedulers


def local_optimizer(models: Sequence[nn.Module], trainer: Any = None) -> torch.optim.Optimizer:
    """The local solver's optimizer alone (a fresh one, e.g. to read its settings or state layout)."""
    return local_solver(models, trainer)[0]


def tie_shared_layers(copies: Sequence[nn.Module], shared_layers: Sequence[str]) -> list[Tensor]:
    """Make the named submodules (dotted paths, e.g. ``"features"``) of every copy the very module of
    copy 0: one shared feature extractor, K heads. Returns the shared federated tensors."""
    shared: list[Tensor] = []
    for path in shared_layers:
        try:
            module = copies[0].get_submodule(path)
        except AttributeError as error:
            raise ValueError(
                f"shared_layers names '{path}', which is not a submodule of {type(copies[0]).__name__}: "
                f"use a name from named_modules(), e.g. one of {[n for n, _ in copies[0].named_children()]}"
            ) from error
        parent_path, _, name = path.rpartition(".")
        for clone in copies[1:]:
            parent = clone.get_submodule(parent_path) if parent_path else clone
            setattr(parent, name, module)
        shared.extend(state_tensors_of(module))
    return shared


Snapshot = tuple[list[list[Tensor]], list[Tensor]]  # (per-cluster tensors, shared-layer tensors)


class ClusterCopies:
    """The K working copies seen as federated tensors: per cluster (shared layers excluded) and
    the shared layers once. Snapshots are detached clones in the same layout."""

    def __init__(self, models: nn.ModuleList, shared: Sequence[Tensor] = ()) -> None:
        self.models = models
        self.shared_ids = {id(t) for t in shared}

    @property
    def num_clusters(self) -> int:
        return len(self.models)

    def cluster_tensors(self, k: int) -> list[Tensor]:
        """Cluster k's federated tensors (parameters first, then float buffers), shared layers excluded."""
        return [t for t in state_tensors_of(self.models[k]) if id(t) not in self.shared_ids]

    def shared_tensors(self) -> list[Tensor]:
        return [t for t in state_tensors_of(self.models[0]) if id(t) in self.shared_ids]

    def parameter_names(self, k: int) -> list[str]:
        """Names of cluster k's own parameters, in ``cluster_tensors`` order."""
        return [n for n, p in self.models[k].named_parameters() if id(p) not in self.shared_ids]

    def num_params(self, k: int) -> int:
        """How many of ``cluster_tensors(k)`` are parameters (they come first)."""
        return len(self.parameter_names(k))

    def snapshot(self) -> Snapshot:
        clusters = [[t.detach().clone() for t in self.cluster_tensors(k)] for k in range(self.num_clusters)]
        return clusters, [t.detach().clone() for t in self.shared_tensors()]

    @torch.no_grad()
    def load(self, snapshot: Snapshot) -> None:
        """Copy a snapshot into the working copies, in place."""
        clusters, shared = snapshot
        for k in range(self.num_clusters):
            for t, g in zip(self.cluster_tensors(k), clusters[k], strict=True):
                t.copy_(g)
        for t, g in zip(self.shared_tensors(), shared, strict=True):
            t.copy_(g)

    @torch.no_grad()
    def load_cluster(self, k: int, tensors: Sequence[Tensor]) -> None:
        for t, g in zip(self.cluster_tensors(k), tensors, strict=True):
            t.copy_(g)

    def read_vector(self, copies: Sequence[int]) -> Tensor:
        """The given copies' federated tensors as one flat float32 vector."""
        return torch.cat([t.detach().flatten().float() for k in copies for t in self.cluster_tensors(k)])

    @torch.no_grad()
    def write_vector(self, vector: Tensor, copies: Sequence[int]) -> None:
        """Copy a flat vector (a personal model, a centre) into the given copies, in place."""
        offset = 0
        for k in copies:
            for t in self.cluster_tensors(k):
                t.copy_(vector[offset : offset + t.numel()].view_as(t).to(t))
                offset += t.numel()
