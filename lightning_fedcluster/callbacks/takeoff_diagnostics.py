"""TakeoffDiagnostics: what a soft-clustering run looks like round by round while its clusters
form (or fail to). Attach it to study a run; it costs nothing unless attached, and one no-grad
pass of the K models over every client's training rows per round (plus one backward per client
and model with ``gradients=True``) when it is.

After every round (aggregated weights) it records:

- ``ari``: concept ARI of the clients' argmax ω (the take-off measure), and ``misplaced``: the
  seen clients outside their concept's cluster (``metrics.misplaced_clients``), which it is about;
- ``model_norm`` and ``update_norm`` [K]: each global model's parameter norm and how far the
  round moved it, ‖θ_k(t) − θ_k(t−1)‖ (``update_norm_max`` over the alive clusters): a run that
  diverges shows it here first (a one-concept run's survivor moved 5x more a round after the
  grouping concentrated ω, then fell to chance);
- ``model_distance``: pairwise relative parameter distances ‖θ_k − θ_l‖ / mean(‖θ_k‖, ‖θ_l‖) and
  ``model_tv``: the mean total-variation distance of two models' predictions over all rows;
- ``margin``: each client's E-step margin, the best minus the second-best cluster's mean
  log-likelihood per sample, Σ_j (−f_jk − log C_{y_j,k}) / N_i (the prior ω left out), and those
  means themselves (``cluster_scores`` [M, K]), with every client's ω;
- ``gamma_entropy`` (mean over samples of H(γ_j), with the client's current ω) and
  ``omega_entropy`` per client, in nats (log K is uniform);
- ``shares``: the share of each concept's data each cluster explains;
- the information a grouping rule would have at this round: the ARI of k-medoids groups (as many
  as alive clusters) of client signatures (``algorithms/signatures.py``): the label-conditioned
  mean prediction of the alive models by centred cosine, as concept grouping uses it
  (``prediction_ari``; ``prediction_within`` / ``prediction_between``: the largest distance
  within a concept and the smallest between two; ``prediction_separation``: the mean distance
  between concepts over the mean within; ``group_spread``: the mean client-to-medoid distance
  with 1, 2, ... groups), the same by total variation (``prediction_tv_ari``) and by complete
  linkage on it (``prediction_linkage_ari``), the K models' predictions side by side
  (``prediction_k_ari``), the label-conditioned mean losses (``loss_ari``) and, with
  ``gradients=True``, the last layer's gradient of every model's mean loss by cosine
  (``gradient_ari``).

Scalars go to the trainer's loggers under ``takeoff/``; ``rows`` keeps every round (with the
per-client lists) and ``save(path)`` writes them as JSON for figures.
"""

from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lightning_fedcluster.algorithms.base import masked_log_omega
from lightning_fedcluster.algorithms.cfl import cosine_similarity_matrix
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.algorithms.signatures import (
    client_signature,
    group_clients,
    k_medoids,
    label_conditioned_means,
    signature_distances,
)
from lightning_fedcluster.metrics.clustering import (
    concept_ari,
    concept_shares,
    grouping_ari,
    misplaced_clients,
)


def seen_misplaced(omega: Tensor, concept: Tensor, seen: Tensor) -> list[int]:
    """The seen clients (indices among all) outside their concept's cluster by argmax ω."""
    seen_clients = seen.cpu().nonzero().flatten()
    groups = omega.cpu()[seen_clients].argmax(1)
    return seen_clients[misplaced_clients(groups, concept.cpu()[seen_clients])].tolist()


def entropy(p: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy in nats along ``dim`` (0 log 0 = 0)."""
    return -(p * p.clamp_min(1e-300).log()).sum(dim)


def within_between(distances: Tensor, truth: Tensor) -> tuple[float, float]:
    """The largest distance within a concept and the smallest between two: a threshold between
    them groups exactly by concept."""
    same = truth.unsqueeze(0) == truth.unsqueeze(1)
    off = ~torch.eye(truth.numel(), dtype=torch.bool)
    known = ~distances.isnan()
    within, between = distances[same & off & known], distances[~same & known]
    return (
        float(within.max()) if within.numel() else math.nan,
        float(between.min()) if between.numel() else math.nan,
    )


def separation(distances: Tensor, truth: Tensor) -> float:
    """Mean distance between clients of different concepts over the mean within a concept."""
    same = truth.unsqueeze(0) == truth.unsqueeze(1)
    off = ~torch.eye(truth.numel(), dtype=torch.bool)
    known = ~distances.isnan()
    within = distances[same & off & known]
    between = distances[~same & known]
    if within.numel() == 0 or between.numel() == 0:
        return math.nan
    return float(between.mean() / within.mean().clamp_min(1e-12))


class TakeoffDiagnostics(pl.Callback):
    """Per-round diagnostics of cluster formation (see the module docstring).

    Args:
        gradients: also compute each client's last-layer gradient signature (one backward per
            client and model per round).
        every: record every this many rounds (and always the first).
        path: write the rows there (JSON) after every recorded round.
        keep_signatures: keep every client's prediction signature in the rows (for offline study).
    """

    def __init__(
        self,
        gradients: bool = False,
        every: int = 1,
        path: str | Path | None = None,
        keep_signatures: bool = False,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.gradients = gradients
        self.every = every
        self.path = None if path is None else Path(path)
        self.keep_signatures = keep_signatures
        self.rows: list[dict[str, Any]] = []
        self.round_start: list[Tensor] | None = None  # the models at the start of a recorded round

    def recorded(self, round_number: int) -> bool:
        return round_number == 1 or round_number % self.every == 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.recorded(trainer.current_epoch + 1):
            self.round_start = flat_models(pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        round_number = trainer.current_epoch + 1
        if not self.recorded(round_number):
            return
        row = self.measure(trainer, pl_module)
        row["round"] = round_number
        self.rows.append(row)
        if self.path is not None and trainer.is_global_zero:
            self.save(self.path)
        if trainer.is_global_zero:
            scalars = {f"takeoff/{k}": v for k, v in row.items() if isinstance(v, float)}
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=round_number)

    @torch.no_grad()
    def measure(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        state = pl_module.client_state
        dm = trainer.datamodule
        concept = dm.metadata.concept.cpu()
        k_total, c = state.num_clusters, dm.num_classes
        active = state.active.cpu()
        log_stats = label_statistics(pl_module.rule, state)
        log_stats = None if log_stats is None else log_stats.cpu().to(torch.float64)
        margins, gamma_h, omega_h, pred_means, loss_means, counts, grads = [], [], [], [], [], [], []
        pred_k_means: list[Tensor] = []
        cluster_scores: list[list[float]] = []
        tv_sum = torch.zeros(k_total, k_total, dtype=torch.float64)
        rows = 0
        for i in range(dm.num_clients):
            x, y = pl_module.split("train", i)
            losses, probs = pl_module.evaluate_clusters(x, y)
            losses, probs, y_cpu = losses.cpu().double(), probs.cpu().double(), y.cpu()
            scores = -losses if log_stats is None else -losses - log_stats[y_cpu]
            mean_ll = scores.mean(0).masked_fill(~active, -math.inf)
            cluster_scores.append(scores.mean(0).tolist())
            top = mean_ll.topk(min(2, int(active.sum()))).values
            margins.append(float(top[0] - top[1]) if top.numel() > 1 else 0.0)
            log_gamma = torch.log_softmax(scores + masked_log_omega(state.omega[i].cpu(), active), dim=1)
            gamma_h.append(float(entropy(log_gamma.exp()).mean()))
            omega_h.append(float(entropy(state.omega[i].cpu().double())))
            flat = probs.permute(1, 0, 2).reshape(y_cpu.numel(), -1)
            mean, count = label_conditioned_means(flat, y_cpu, c)
            pred_k_means.append(mean)
            pred_means.append(client_signature(probs, y_cpu, active, c)[0])
            counts.append(count)
            loss_means.append(label_conditioned_means(losses, y_cpu, c)[0])
            tv_sum += 0.5 * (probs.unsqueeze(0) - probs.unsqueeze(1)).abs().sum(-1).sum(-1)
            rows += y_cpu.numel()
            if self.gradients:
                grads.append(last_layer_gradients(pl_module, x, y))
        row: dict[str, Any] = {
            "ari": concept_ari(state.omega, concept, state.seen),
            "misplaced": seen_misplaced(state.omega, concept, state.seen),
            "margin": margins,
            "gamma_entropy": gamma_h,
            "omega_entropy": omega_h,
            "shares": concept_shares(state.omega, concept, dm.train_sizes).tolist(),
            "active": int(active.sum()),
            "active_clusters": active.nonzero().flatten().tolist(),
            "cluster_scores": cluster_scores,
            "omega": state.omega.tolist(),
        }
        row["margin_median"] = float(torch.tensor(margins).median())
        row["gamma_entropy_mean"] = float(torch.tensor(gamma_h).mean())
        row["omega_entropy_mean"] = float(torch.tensor(omega_h).mean())
        pairs = list(combinations(active.nonzero().flatten().tolist(), 2))
        vectors = flat_models(pl_module)
        row["model_norm"] = [float(v.norm()) for v in vectors]
        if self.round_start is not None:
            start_and_end = zip(self.round_start, vectors, strict=True)
            moved = [float((end - start).norm()) for start, end in start_and_end]
            row["update_norm"] = moved
            row["update_norm_max"] = max(moved[k] for k in row["active_clusters"])
        distance = [
            float((vectors[a] - vectors[b]).norm() / (0.5 * (vectors[a].norm() + vectors[b].norm())))
            for a, b in pairs
        ]
        tv = [float(tv_sum[a, b] / rows) for a, b in pairs]
        row["model_distance"], row["model_tv"] = distance, tv
        row["model_distance_min"] = min(distance) if distance else math.nan
        row["model_tv_min"] = min(tv) if tv else math.nan
        groups = int(active.sum())
        stacked, rows_per_label = torch.stack(pred_means), torch.stack(counts)
        pred_d, _ = signature_distances(stacked, rows_per_label)
        row["prediction_ari"] = grouping_ari(concept, k_medoids(pred_d, groups)[0])
        row["prediction_within"], row["prediction_between"] = within_between(pred_d, concept)
        row["prediction_separation"] = separation(pred_d, concept)
        row["group_spread"] = [k_medoids(pred_d, g)[1] / dm.num_clients for g in range(1, groups + 1)]
        tv_d, _ = signature_distances(stacked, rows_per_label, metric="tv")
        row["prediction_tv_ari"] = grouping_ari(concept, k_medoids(tv_d, groups)[0])
        row["prediction_linkage_ari"] = grouping_ari(concept, group_clients(tv_d, num_groups=groups))
        pred_k_d, _ = signature_distances(torch.stack(pred_k_means), rows_per_label)
        row["prediction_k_ari"] = grouping_ari(concept, k_medoids(pred_k_d, groups)[0])
        loss_d, _ = signature_distances(torch.stack(loss_means), rows_per_label, metric="tv")
        row["loss_ari"] = grouping_ari(concept, k_medoids(loss_d, groups)[0])
        row["loss_separation"] = separation(loss_d, concept)
        if self.gradients:
            grad_d = 1.0 - cosine_similarity_matrix(torch.stack(grads))
            row["gradient_ari"] = grouping_ari(concept, k_medoids(grad_d, groups)[0])
            row["gradient_separation"] = separation(grad_d, concept)
        if self.keep_signatures:
            row["signatures"] = stacked.tolist()
            row["signature_rows"] = rows_per_label.tolist()
        return row

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.rows))

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict.get("rows", []))


def flat_models(pl_module: pl.LightningModule) -> list[Tensor]:
    """Every cluster model's parameters as one float64 vector on the CPU, per cluster [K]."""
    return [
        torch.cat([t.detach().flatten().double().cpu() for t in pl_module.cluster_tensors(k)])
        for k in range(pl_module.client_state.num_clusters)
    ]


def last_layer_gradients(pl_module: pl.LightningModule, x: Tensor, y: Tensor) -> Tensor:
    """The gradient of every cluster model's mean training loss on (x, y) with respect to its
    last parameters (the final layer's weight and bias), concatenated over models, float64 [P]."""
    parts = []
    for k, model in enumerate(pl_module.models):
        params = [p for p in model.parameters() if p.requires_grad][-2:]
        with torch.enable_grad():
            loss = pl_module.per_sample_loss(k, x, y).mean()
            grads = torch.autograd.grad(loss, params)
        parts += [g.detach().flatten().double().cpu() for g in grads]
    return torch.cat(parts)
