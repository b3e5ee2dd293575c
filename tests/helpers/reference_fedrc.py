"""FedRC written as a plain PyTorch loop, independent of Lightning and of the engine's
bookkeeping: the engine must reproduce it exactly. It follows ALGORITHMS.md step by step and
uses the engine's documented seeds (client sampling, minibatch order)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from lightning_fedcluster.algorithms.mixture import label_statistics
from lightning_fedcluster.engine.client_sampling import RoundSchedule, derive_seed


def reference_fedrc(
    datamodule, initial_models, *, rounds, clients_per_round, local_steps, lr, seed, use_label_stats=True
):
    """Returns (global models, ω [M, K], label sums [M, C, K]) after ``rounds`` rounds."""
    models = [copy.deepcopy(m) for m in initial_models]
    k_count, m_count, c_count = len(models), datamodule.num_clients, datamodule.num_classes
    omega = torch.full((m_count, k_count), 1.0 / k_count, dtype=torch.float64)
    sums = torch.zeros(m_count, c_count, k_count, dtype=torch.float64)
    seen = torch.zeros(m_count, dtype=torch.bool)
    steps = torch.full((m_count,), local_steps)
    schedule = RoundSchedule(m_count, clients_per_round, steps, seed)
    for r in range(rounds):
        log_c = label_statistics(sums[seen]).log() if use_label_stats else None
        delta = [[torch.zeros_like(p, dtype=torch.float64) for p in m.parameters()] for m in models]
        weight = torch.zeros(k_count, dtype=torch.float64)
        reports = {}
        for client in schedule.clients(r).tolist():
            x, y = datamodule.train_split(client)
            local = [copy.deepcopy(m) for m in models]
            with torch.no_grad():
                losses = torch.stack([F.cross_entropy(m(x), y, reduction="none") for m in local], 1).double()
            scores = omega[client].log() - losses
            if log_c is not None:
                scores = scores - log_c[y]
            gamma = torch.softmax(scores, dim=1)
            label_sum = torch.zeros(c_count, k_count, dtype=torch.float64).index_add_(0, y, gamma)
            reports[client] = (gamma.mean(0), label_sum)
            optimizer = torch.optim.SGD([p for m in local for p in m.parameters()], lr=lr)
            order = torch.randperm(
                len(y), generator=torch.Generator().manual_seed(derive_seed(seed, r, client, 0xBA7C))
            )
            size = min(datamodule.batch_size, len(y))
            w = gamma.float()
            for step in range(local_steps):
                idx = order[(step * size + torch.arange(size)) % len(y)]
                total = torch.zeros(())
                for k, m in enumerate(local):
                    loss = F.cross_entropy(m(x[idx]), y[idx], reduction="none")
                    total = total + (w[idx, k] * loss).sum() / size
                optimizer.zero_grad()
                total.backward()
                optimizer.step()
            for k in range(k_count):
                pairs = zip(local[k].parameters(), models[k].parameters(), strict=True)
                for acc, (new, old) in zip(delta[k], pairs, strict=True):
                    acc.add_((new.detach() - old.detach()).double(), alpha=float(len(y)))
                weight[k] += len(y)
        with torch.no_grad():
            for k, m in enumerate(models):
                for p, acc in zip(m.parameters(), delta[k], strict=True):
                    p.add_((acc * (1.0 / float(weight[k]))).float())
        for client, (om, label_sum) in reports.items():
            omega[client], sums[client], seen[client] = om, label_sum, True
    return models, omega, sums
