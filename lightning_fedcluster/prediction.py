"""Predictions for any client, one object the ClusteredModule holds (``Predictions``): a
participating client predicts with its own mixture weights ω (or its personal model), a client
that took no part in training with the ω the algorithm's rule fits on its labelled data
(``new_client``), and a client without labels with the mixture prior. The mixture itself is
``engine.evaluation.mixture_prediction``, the one the evaluation scores.

``trainer.predict`` gives ``predict_step`` two kinds of batch:

- the FederatedDataModule's ``predict_dataloader`` (``trainer.predict(datamodule=dm)``): the rows
  ``trainer.test`` scores. Every participating client's test rows, predicted with its own ω (or
  personal model); every global client's test score rows, predicted with the ω the algorithm's
  rule fits on its test adapt rows and labels (as ``module.new_client``). Each dict holds
  ``client`` [N] (participating client, -1 for a global client's rows), ``global_client`` [N]
  (-1 for a participating client's rows), ``row`` [N] (the row's position within that client's
  held-out rows, ``client_test[i]``, or within ``global_split(g)``), ``target`` [N], ``omega``
  [N, K], and ``probs`` [N, C] with ``preds`` [N] (classification) or ``preds`` [N, D] (regression).
- plain inputs (``trainer.predict(module, dataloaders=loader)``): a batch is a tensor x (or a
  one-tensor tuple, e.g. from ``TensorDataset(x)``), every row from a client without labels, or a
  dict ``{"x": x, "client": ids}`` (``ClientInputs``), ids naming participating clients, -1 for a
  client without labels. A client without labels is predicted with the mixture prior. Each dict
  holds ``client``, ``omega``, ``probs``/``preds``. A tuple (x, ids) is refused: it cannot be told
  from (x, labels).

All outputs are on the CPU; ``concat_predictions`` joins the batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import Dataset

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.datamodules.loaders import EvaluationChunk
from lightning_fedcluster.engine.copies import attached_trainer
from lightning_fedcluster.engine.evaluation import (
    Evaluation,
    mixture_prediction,
    personal_prediction,
    predicts_per_client,
)
from lightning_fedcluster.engine.host import TrainingHost

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
    module: Any  # the ClusteredModule whose cluster models predict

    def predict_proba(self, x: Tensor) -> Tensor:
        return self.module.predict_proba(x, self.omega)

    def predict(self, x: Tensor) -> Tensor:
        out = self.predict_proba(x)
        return self.module.task.predict(out)


class ClientInputs(Dataset):
    """Rows x [N, ...] with the client each comes from, ``client`` [N] (participating clients'
    indices, -1 for a client without labels), for ``trainer.predict``: yields ``{"x", "client"}``."""

    def __init__(self, x: Tensor, client: Tensor | Sequence[int]) -> None:
        client = torch.as_tensor(client)
        if client.dim() != 1 or client.shape[0] != x.shape[0]:
            raise ValueError(
                f"client must hold one id per row of x ({x.shape[0]}), got shape {tuple(client.shape)}"
            )
        self.x, self.client = x, client.long()

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"x": self.x[index], "client": self.client[index]}


def prediction_inputs(batch: Any) -> tuple[Tensor, Tensor | None]:
    """(x, client ids or None) of a plain predict batch; a clear error for anything ambiguous."""
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, (list, tuple)) and len(batch) == 1 and isinstance(batch[0], Tensor):
        return batch[0], None
    if isinstance(batch, Mapping) and "x" in batch and set(batch) <= {"x", "client"}:
        return batch["x"], batch.get("client")
    kind = (
        f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (list, tuple)) else repr(type(batch))
    )
    raise TypeError(
        f"a predict batch must be a tensor x (rows of clients without labels: the mixture prior) or a dict "
        f"{{'x': x, 'client': ids}} (lightning_fedcluster.prediction.ClientInputs(x, ids)), got {kind}: a "
        "tuple (x, ...) could hold labels or client ids. For a new client with labels use "
        "module.new_client(x_adapt, y_adapt).predict(x)"
    )


def concat_predictions(batches: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """``trainer.predict``'s list of per-batch dicts (one dataloader) joined into one dict."""
    if not batches:
        return {}
    if not isinstance(batches[0], Mapping):
        raise TypeError(
            "concat_predictions takes the list of dicts of one dataloader; with several predict "
            "dataloaders, call it once per dataloader's list"
        )
    return {key: torch.cat([batch[key] for batch in batches]) for key in batches[0]}


class Predictions:
    """The ClusteredModule's predictions (its ``new_client``, ``adapt``, ``mixture_prior``,
    ``predict``, ``predict_proba`` and ``trainer.predict`` hooks delegate here), from the host's
    cluster models, rule and client store."""

    def __init__(self, host: TrainingHost) -> None:
        self.host = host
        self.rows: Evaluation | None = None  # the test rows of a trainer.predict over the datamodule

    @torch.no_grad()
    def adapt(self, x: Tensor, y: Tensor) -> Tensor:
        """Mixture weights ω [K] of a client that took no part in training, from its labelled data."""
        host, state = self.host, self.trained_state("new_client / adapt")
        losses, _ = host.evaluate_clusters(x.to(host.device), y.to(host.device))
        active = state.active.to(host.device)
        return host.rule.unseen_client_mixture(losses, y.to(host.device), self.current_label_stats(), active)

    def mixture_prior(self) -> Tensor:
        """ω [K] of a client without labels (``mixture_prior`` above, over the host's datamodule)."""
        state = self.trained_state("mixture_prior")
        trainer = attached_trainer(self.host)
        datamodule = trainer.datamodule if trainer is not None else None
        if datamodule is None:
            raise RuntimeError(
                "the mixture prior weighs the participating clients by their training samples: predict "
                "with the trainer that fit the module (its datamodule attached)"
            )
        sizes = datamodule.train_sizes
        return mixture_prior(state.omega, sizes, state.seen, state.active).to(self.host.device)

    def client_omega(self, client: int | None = None) -> Tensor:
        """ω [K] of participating client ``client``, or the mixture prior for ``None`` or -1."""
        if client is None or client == UNSEEN:
            return self.mixture_prior()
        ids = self.client_ids(client, 1)
        return self.trained_state().omega[int(ids[0])].to(self.host.device)

    def omega_table(self) -> Tensor:
        """[M + 1, K]: every participating client's ω, then the mixture prior (row M, for -1)."""
        return torch.cat([self.trained_state().omega.to(self.host.device), self.mixture_prior().unsqueeze(0)])

    @torch.no_grad()
    def predict_proba(
        self, x: Tensor, omega: Tensor | None = None, *, client: int | Tensor | None = None
    ) -> Tensor:
        """p(y|x) [N, C] (regression: [N, D]) by ``omega``, by ``client`` or by the mixture prior
        (``ClusteredModule.predict_proba``)."""
        host, state = self.host, self.trained_state("predict / predict_proba")
        x = x.to(host.device)
        if omega is not None:
            if client is not None:
                raise ValueError("give predict_proba either omega or client, not both")
            return mixture_prediction(host, x, omega.to(host.device))
        ids = self.client_ids(UNSEEN if client is None else client, x.shape[0])
        table = self.omega_table()
        owner = torch.where(ids < 0, state.num_clients, ids).to(host.device)
        if not predicts_per_client(host):
            used, owner = owner.unique(return_inverse=True)
            return mixture_prediction(host, x, table[used], owner)
        snapshot, stats, parts = host.copies.snapshot(), self.current_label_stats(), []
        for index in owner.unique().tolist():
            rows = (owner == index).nonzero().flatten()
            if index < state.num_clients:
                parts.append((rows, personal_prediction(host, index, x[rows], stats, snapshot)))
            else:
                parts.append((rows, mixture_prediction(host, x[rows], table[index])))
        out = parts[0][1].new_empty(x.shape[0], *parts[0][1].shape[1:]) if parts else x.new_empty(0)
        for rows, prediction in parts:
            out[rows] = prediction
        return out

    def current_label_stats(self) -> Tensor | None:
        """log C_{y,k} of the trained store, on the host's device (None: the rule keeps none)."""
        stats = label_statistics(self.host.rule, self.trained_state("current_label_stats"))
        return None if stats is None else stats.to(self.host.device)

    def trained_state(self, caller: str = "predict") -> ClientState:
        """The client store; a RuntimeError naming ``caller`` and the fix before any fit."""
        if self.host.client_state is None:
            raise RuntimeError(
                f"{caller} needs a trained ClusteredModule, and this one has not been fit yet (no client "
                "state): call it after trainer.fit(module, datamodule=dm) on this module (or on "
                "trainer.lightning_module), or load a checkpoint first, e.g. with "
                "trainer.predict(module, datamodule=dm, ckpt_path=...)"
            )
        return self.host.client_state

    def client_ids(self, client: int | Tensor, rows: int) -> Tensor:
        """``client`` as a LongTensor [rows] of participating-client indices or -1, checked."""
        count = self.trained_state().num_clients
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

    # ------------------------------------------------------------------ trainer.predict
    def start(self) -> None:
        """A predict pass begins: warn when no client has trained the cluster models."""
        self.rows = None
        if not bool(self.trained_state().seen.any()):
            rank_zero_warn(
                "predicting with cluster models that took part in no training round: pass the module fit "
                "trained (trainer.lightning_module; a plain LightningModule given to this trainer's fit "
                "also maps to it) or a checkpoint (trainer.predict(..., ckpt_path=...))"
            )

    def end(self) -> None:
        self.rows = None

    def step(self, batch: Any) -> dict[str, Tensor]:
        """Personalised predictions of one batch (see the module docstring for the dict's keys)."""
        if isinstance(batch, EvaluationChunk):
            return self._datamodule_predictions(batch)
        x, client = prediction_inputs(batch)
        ids = self.client_ids(UNSEEN if client is None else client, x.shape[0])
        prediction = self.predict_proba(x, client=ids)
        table = self.omega_table()
        omega = table[torch.where(ids < 0, table.shape[0] - 1, ids)]
        return self._prediction_dict(prediction, client=ids, omega=omega)

    def _datamodule_predictions(self, item: EvaluationChunk) -> dict[str, Tensor]:
        host = self.host
        if self.rows is None:
            self.rows = Evaluation(host, "test")
        rows, dm = self.rows, host.trainer.datamodule
        if item.global_index >= 0:
            g = item.global_index
            omega, prediction = rows.global_prediction(host, g)
            _, y, offsets = rows.rows["global_score"]
            start, stop = int(offsets[g]), int(offsets[g + 1])
            positions = dm.evaluation_rows("test", "global_score")[start:stop]
            return self._prediction_dict(
                prediction,
                client=torch.full((stop - start,), UNSEEN),
                global_client=torch.full((stop - start,), g),
                row=positions,
                target=y[start:stop],
                omega=omega.expand(stop - start, -1),
            )
        clients = item.clients.tolist()
        _, y, offsets = rows.rows["local"]
        start, stop = (int(offsets[clients[0]]), int(offsets[clients[-1] + 1])) if clients else (0, 0)
        if clients:
            prediction = rows.local_prediction(host, clients)
        else:  # a padding item: no rows
            prediction = torch.zeros(0, dm.output_size, device=host.device)
        chosen = torch.tensor(clients, dtype=torch.long)
        ids = chosen.repeat_interleave(offsets[chosen + 1] - offsets[chosen])
        return self._prediction_dict(
            prediction,
            client=ids,
            global_client=torch.full((stop - start,), UNSEEN),
            row=dm.evaluation_rows("test", "local")[start:stop],
            target=y[start:stop],
            omega=self.trained_state().omega[ids],
        )

    def _prediction_dict(self, prediction: Tensor, **fields: Tensor) -> dict[str, Tensor]:
        out = {name: value.detach().cpu() for name, value in fields.items()}
        prediction = prediction.detach().cpu()
        if self.host.task.is_classification:
            out["probs"], out["preds"] = prediction, prediction.argmax(1)
        else:
            out["preds"] = prediction
        return out
