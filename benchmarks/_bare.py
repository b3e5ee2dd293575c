"""A bare PyTorch FedRC/FedEM round: the same forward/backward passes as the engine, no framework.

Per client: load the K global models into K working copies, one no-grad eval-mode forward of
each model over the client's training data (E-step, which also gives train loss/accuracy),
``steps`` weighted SGD steps (batch min(B, N_i), positions wrapping modulo N_i, one backward of
the sum over clusters, loss (1/B) Σ_j γ_jk f_jk), accumulate N_i·Δθ in float64. Server: apply
the weighted average. Evaluation: one no-grad forward of each model over every client's test
split and the ω-mixture prediction. Used as the denominator of the overhead ratios.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from _common import clock
from torch import Tensor, nn

from lightning_fedcluster import FederatedDataModule

PHASES = ("e_step", "local_training", "aggregation", "evaluation")


class BareFedRC:
    """FedRC (``use_label_stats``) or FedEM rounds over ``datamodule`` with full participation."""

    def __init__(self, models: Sequence[nn.Module], datamodule: FederatedDataModule, *, lr: float,
                 local_epochs: int = 1, use_label_stats: bool = True, seed: int = 0) -> None:
        self.globals = [copy.deepcopy(m) for m in models]
        self.work = [copy.deepcopy(m) for m in models]
        self.dm, self.lr, self.epochs, self.use_label_stats = datamodule, lr, local_epochs, use_label_stats
        k, m, c = len(models), datamodule.num_clients, datamodule.num_classes
        self.omega = torch.full((m, k), 1.0 / k, dtype=torch.float64)
        self.sums = torch.zeros(m, c, k, dtype=torch.float64)
        self.generator = torch.Generator().manual_seed(seed)
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)

    def _log_stats(self) -> Tensor | None:
        if not self.use_label_stats:
            return None
        total = self.sums.sum(0)
        column = total.sum(0, keepdim=True)
        uniform = torch.full_like(total, 1 / total.shape[0])
        stats = torch.where(column > 0, total / column.clamp_min(1e-300), uniform)
        return stats.clamp_min(1e-8).log()

    def round(self, evaluate: bool = True) -> dict[str, float]:
        """One round; returns the seconds spent in each phase."""
        before = dict(self.phase_seconds)
        dm, k_count = self.dm, len(self.work)
        log_c = self._log_stats()
        global_params = [list(m.parameters()) for m in self.globals]
        deltas = [[torch.zeros_like(p, dtype=torch.float64) for p in ps] for ps in global_params]
        weight = 0.0
        for client in range(dm.num_clients):
            start = clock()
            x, y = dm.train_split(client)
            n = y.shape[0]
            with torch.no_grad():
                for model, params in zip(self.work, global_params, strict=True):
                    for p, g in zip(model.parameters(), params, strict=True):
                        p.copy_(g)
                losses, probs = [], []
                for model in self.work:
                    model.eval()
                    logits = model(x)
                    losses.append(F.cross_entropy(logits, y, reduction="none"))
                    probs.append(torch.softmax(logits, 1))
                    model.train()
                losses_nk = torch.stack(losses, 1).double()
                scores = self.omega[client].log() - losses_nk
                if log_c is not None:
                    scores = scores - log_c[y]
                gamma = torch.softmax(scores, 1)
                self.omega[client] = gamma.mean(0)
                self.sums[client] = torch.zeros_like(self.sums[client]).index_add_(0, y, gamma)
                mixture = torch.einsum("knc,k->nc", torch.stack(probs).double(), self.omega[client])
                self.train_correct = int((mixture.argmax(1) == y).sum())
            w = gamma.float()
            mid = clock()
            optimizer = torch.optim.SGD([p for m in self.work for p in m.parameters()], lr=self.lr)
            size = min(dm.batch_size, n)
            steps = self.epochs * math.ceil(n / dm.batch_size)
            order = torch.randperm(n, generator=self.generator)
            for step in range(steps):
                index = order[(step * size + torch.arange(size)) % n]
                xb, yb, wb = x[index], y[index], w[index]
                optimizer.zero_grad()
                total = sum((wb[:, k] * F.cross_entropy(self.work[k](xb), yb, reduction="none")).sum() / size
                            for k in range(k_count))
                total.backward()
                optimizer.step()
            end = clock()
            with torch.no_grad():
                for model, params, acc in zip(self.work, global_params, deltas, strict=True):
                    for p, g, a in zip(model.parameters(), params, acc, strict=True):
                        a.add_((p - g).double(), alpha=float(n))
            weight += n
            done = clock()
            self.phase_seconds["e_step"] += mid - start
            self.phase_seconds["local_training"] += end - mid
            self.phase_seconds["aggregation"] += done - end
        start = clock()
        with torch.no_grad():
            for params, acc in zip(global_params, deltas, strict=True):
                for g, a in zip(params, acc, strict=True):
                    g.add_((a / weight).to(g.dtype))
        self.phase_seconds["aggregation"] += clock() - start
        if evaluate:
            start = clock()
            self.evaluate()
            self.phase_seconds["evaluation"] += clock() - start
        return {p: self.phase_seconds[p] - before[p] for p in PHASES}

    @torch.no_grad()
    def evaluate(self) -> float:
        """Local test accuracy of the ω-mixture (one forward of each model per client)."""
        correct = total = 0
        for model in self.globals:
            model.eval()
        for client in range(self.dm.num_clients):
            x, y = self.dm.test_split(client)
            if y.numel() == 0:
                continue
            probs = torch.stack([torch.softmax(m(x), 1) for m in self.globals])
            predicted = torch.einsum("knc,k->nc", probs.double(), self.omega[client]).argmax(1)
            correct += int((predicted == y).sum())
            total += y.numel()
        for model in self.globals:
            model.train()
        return correct / max(total, 1)


def time_bare(bare: BareFedRC, rounds: int, *, evaluate: bool) -> list[dict[str, float]]:
    """Run ``rounds`` rounds; one row per round with the total and the phases."""
    rows = []
    for _ in range(rounds):
        start = clock()
        phases = bare.round(evaluate=evaluate)
        row = {"round": clock() - start, **phases}
        row["other"] = row["round"] - sum(phases.values())
        rows.append(row)
    return rows


class InterleavedBare(pl.Callback):
    """A Lightning callback that runs one bare round after every engine round (outside the
    engine's round timer), so that both see the same machine state: this machine's speed drifts
    by up to 2x over minutes, and paired rounds cancel most of it. Register it after RoundTimer."""

    def __init__(self, bare: BareFedRC, *, evaluate: bool) -> None:
        self.bare, self.evaluate, self.rows = bare, evaluate, []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.rows.extend(time_bare(self.bare, 1, evaluate=self.evaluate))
