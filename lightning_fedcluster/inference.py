"""Inference for any client: a participating client predicts with its own mixture weights ω
(or its personal model), a client that took no part in training with the ω the algorithm's rule
fits on its labelled data (``new_client``), and a client without labels with the mixture prior.
The mixture itself is ``engine.evaluation.mixture_prediction``, the one the evaluation scores."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.engine.copies import attached_trainer
from lightning_fedcluster.engine.evaluation import (
    mixture_prediction,
    personal_prediction,
    predicts_per_client,
)
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.task import Task

UNSEEN = -1  # the client id of a row from a client without labels: predicted with the mixture prior


def mixture_prior(omega: Tensor, sizes: Tensor, seen: Tensor, active: Tensor) -> Tensor:
    """The ω of a client known by nothing but its inputs: π_k = Σ_i N_i ω_ik / Σ_i N_i over the
    participating clients that took part in training (the share of all training samples cluster k
    explains), restricted to the active clusters; uniform over them before any client took part.

    ``omega`` [M, K], ``sizes`` [M] training samples, ``seen`` [M] bool, ``active`` [K] bool."""
    keep = active.to(omega.device, omega.dtype)
    weights = (sizes.to(omega.device, omega.dtype) * seen.to(omega.device, omega.dtype)).unsqueeze(1)
    prior = (weights * omega).sum(0) * keep
    if not bool(prior.sum() > 0):
        prior = keep
    return prior / prior.sum()


@dataclass
class ClientPredictor:
    """A client's mixture weights ω [K] and its predictor p(y|x) (or ŷ for regression)."""

    omega: Tensor
    module: TrainingHost

    def predict_proba(self, x: Tensor) -> Tensor:
        return self.module.predict_proba(x, self.omega)

    def predict(self, x: Tensor) -> Tensor:
        out = self.predict_proba(x)
        return Task.of(self.module.task).predict(out)


class NewClients:
    """The ClusteredModule's inference API (a mixin: it uses the module's cluster models and rule)."""

    @torch.no_grad()
    def adapt(self: TrainingHost, x: Tensor, y: Tensor) -> Tensor:
        """Mixture weights ω [K] of a client that took no part in training, from its labelled
        data (the algorithm's rule: iterated E-step, lowest loss, ...); the models are not changed."""
        state = self._trained_state("new_client / adapt")
        losses, _ = self.evaluate_clusters(x.to(self.device), y.to(self.device))
        active = state.active.to(self.device)
        return self.rule.unseen_client_mixture(losses, y.to(self.device), self.current_label_stats(), active)

    def new_client(self: TrainingHost, x: Tensor, y: Tensor) -> ClientPredictor:
        """A predictor for a new client from its labelled data, without training the cluster models."""
        return ClientPredictor(omega=self.adapt(x, y), module=self)

    def mixture_prior(self: TrainingHost) -> Tensor:
        """ω [K] of a client without labels: the participating clients' ω weighted by their
        training samples (``inference.mixture_prior``)."""
        state = self._trained_state("mixture_prior")
        trainer = attached_trainer(self)
        datamodule = trainer.datamodule if trainer is not None else None
        if datamodule is None:
            raise RuntimeError(
                "the mixture prior weighs the participating clients by their training samples: predict "
                "with the trainer that fit the module (its datamodule attached)"
            )
        sizes = datamodule.train_sizes
        return mixture_prior(state.omega, sizes, state.seen, state.active).to(self.device)

    def client_omega(self: TrainingHost, client: int | None = None) -> Tensor:
        """ω [K] of participating client ``client`` (from its last round), or the mixture prior for
        ``None`` (a client without labels)."""
        if client is None or client == UNSEEN:
            return self.mixture_prior()
        ids = self._client_ids(client, 1)
        return self._trained_state().omega[int(ids[0])].to(self.device)

    def omega_table(self: TrainingHost) -> Tensor:
        """[M + 1, K]: every participating client's ω, then the mixture prior (row M, for -1)."""
        return torch.cat([self._trained_state().omega.to(self.device), self.mixture_prior().unsqueeze(0)])

    @torch.no_grad()
    def predict_proba(
        self: TrainingHost, x: Tensor, omega: Tensor | None = None, *, client: int | Tensor | None = None
    ) -> Tensor:
        """p(y|x) [N, C] (regression: the mixture prediction [N, D]) of the cluster models.

        Give at most one of: ``omega`` (mixture weights [K], mixed by the rule's prediction
        weights), ``client`` (a participating client's index, or one per row [N]; -1 marks a row
        of a client without labels), or neither (every row from a client without labels: the
        mixture prior). A participating client predicts as the evaluation scores it: with its own
        ω, its personal model (FedSoft, D-FedEM), or models fine-tuned on its data (FedRC-FT)."""
        state = self._trained_state("predict / predict_proba")
        x = x.to(self.device)
        if omega is not None:
            if client is not None:
                raise ValueError("give predict_proba either omega or client, not both")
            return mixture_prediction(self, x, omega.to(self.device))
        ids = self._client_ids(UNSEEN if client is None else client, x.shape[0])
        table = self.omega_table()
        owner = torch.where(ids < 0, state.num_clients, ids).to(self.device)
        if not predicts_per_client(self):
            used, owner = owner.unique(return_inverse=True)
            return mixture_prediction(self, x, table[used], owner)
        snapshot, stats, parts = self.copies.snapshot(), self.current_label_stats(), []
        for index in owner.unique().tolist():
            rows = (owner == index).nonzero().flatten()
            if index < state.num_clients:
                parts.append((rows, personal_prediction(self, index, x[rows], stats, snapshot)))
            else:
                parts.append((rows, mixture_prediction(self, x[rows], table[index])))
        out = parts[0][1].new_empty(x.shape[0], *parts[0][1].shape[1:]) if parts else x.new_empty(0)
        for rows, prediction in parts:
            out[rows] = prediction
        return out

    def predict(
        self: TrainingHost, x: Tensor, omega: Tensor | None = None, *, client: int | Tensor | None = None
    ) -> Tensor:
        """Predicted labels [N] (regression: predictions [N, D]); arguments as ``predict_proba``."""
        out = self.predict_proba(x, omega, client=client)
        return Task.of(self.task).predict(out)

    def current_label_stats(self: TrainingHost) -> Tensor | None:
        stats = label_statistics(self.rule, self._trained_state("current_label_stats"))
        return None if stats is None else stats.to(self.device)

    def _trained_state(self: TrainingHost, caller: str = "predict") -> ClientState:
        """The client store; a RuntimeError naming ``caller`` and the fix before any fit."""
        if self.client_state is None:
            raise RuntimeError(
                f"{caller} needs a trained ClusteredModule, and this one has not been fit yet (no client "
                "state): call it after trainer.fit(module, datamodule=dm) on this module (or on "
                "trainer.lightning_module), or load a checkpoint first, e.g. with "
                "trainer.predict(module, datamodule=dm, ckpt_path=...)"
            )
        return self.client_state

    def _client_ids(self: TrainingHost, client: int | Tensor, rows: int) -> Tensor:
        """``client`` as a LongTensor [rows] of participating-client indices or -1, checked."""
        count = self._trained_state().num_clients
        ids = torch.as_tensor(client)
        if ids.is_floating_point() or ids.dtype == torch.bool or ids.dim() > 1:
            raise TypeError(f"client must be an integer or an integer tensor [N] of client ids, got {ids!r}")
        ids = ids.long().cpu().expand(rows) if ids.dim() == 0 else ids.long().cpu()
        if ids.shape[0] != rows:
            raise ValueError(f"client has {ids.shape[0]} ids but x has {rows} rows: give one id per row")
        bad = (ids < UNSEEN) | (ids >= count)
        if bool(bad.any()):
            raise ValueError(
                f"client ids must be participating clients 0..{count - 1} or -1 (a client without labels: "
                f"the mixture prior), got {ids[bad][:5].tolist()}; for a new client with labels use "
                "module.new_client(x, y)"
            )
        return ids
