"""``trainer.predict`` for a ClusteredModule: personalised predictions, one dict per batch.

Two kinds of batch reach ``predict_step``:

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
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import Dataset

from lightning_fedcluster.datamodules.loaders import EvaluationChunk
from lightning_fedcluster.engine.evaluation import Evaluation
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.inference import UNSEEN, NewClients


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


class PredictionHooks(NewClients):
    """The ClusteredModule's predict hooks (a mixin over the inference API)."""

    def on_predict_epoch_start(self: TrainingHost) -> None:
        self._prediction_rows: Evaluation | None = None
        state = self._trained_state()
        if not bool(state.seen.any()):
            rank_zero_warn(
                "predicting with cluster models that took part in no training round: pass the module fit "
                "trained (trainer.lightning_module; a plain LightningModule given to this trainer's fit "
                "also maps to it) or a checkpoint (trainer.predict(..., ckpt_path=...))"
            )

    def on_predict_epoch_end(self: TrainingHost) -> None:
        self._prediction_rows = None

    def predict_step(self: TrainingHost, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict:
        """Personalised predictions of one batch (see the module docstring for the dict's keys)."""
        if isinstance(batch, EvaluationChunk):
            return self._datamodule_predictions(batch)
        x, client = prediction_inputs(batch)
        ids = self._client_ids(UNSEEN if client is None else client, x.shape[0])
        prediction = self.predict_proba(x, client=ids)
        table = self.omega_table()
        omega = table[torch.where(ids < 0, table.shape[0] - 1, ids)]
        return self._prediction_dict(prediction, client=ids, omega=omega)

    def _datamodule_predictions(self: TrainingHost, item: EvaluationChunk) -> dict[str, Tensor]:
        if getattr(self, "_prediction_rows", None) is None:
            self._prediction_rows = Evaluation(self, "test")
        rows, dm = self._prediction_rows, self.trainer.datamodule
        if item.global_index >= 0:
            g = item.global_index
            omega, prediction = rows.global_prediction(self, g)
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
            prediction = rows.local_prediction(self, clients)
        else:  # a padding item: no rows
            prediction = torch.zeros(0, dm.output_size, device=self.device)
        chosen = torch.tensor(clients, dtype=torch.long)
        ids = chosen.repeat_interleave(offsets[chosen + 1] - offsets[chosen])
        return self._prediction_dict(
            prediction,
            client=ids,
            global_client=torch.full((stop - start,), UNSEEN),
            row=dm.evaluation_rows("test", "local")[start:stop],
            target=y[start:stop],
            omega=self._trained_state().omega[ids],
        )

    def _prediction_dict(self: TrainingHost, prediction: Tensor, **fields: Tensor) -> dict[str, Tensor]:
        out = {name: value.detach().cpu() for name, value in fields.items()}
        prediction = prediction.detach().cpu()
        if Task.of(self.task).is_classification:
            out["probs"], out["preds"] = prediction, prediction.argmax(1)
        else:
            out["preds"] = prediction
        return out
