"""The vectorised executor (torch.func, ``engine/batched_steps.py``) against the per-client loop.

For one round's clients (all K models start from the same global weights): the E-step (no-grad
forward of the K models over every client's data and the responsibilities) and the local
training (weighted SGD steps of every (client, cluster) pair, the engine's minibatch order).
The loop does what the engine does per client, without Lightning: load the K global models,
torch.optim.SGD, one backward of the summed weighted losses per step. The vectorised executor
runs all pairs at once with vmap (the CNN in chunks of clients to bound memory). Both produce
the same weights (max difference printed).

    python benchmarks/vectorized_executor.py
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import CLOCK_HELP, clock, command_line, machine_line, quiet, set_clock, set_threads
from torch import Tensor, nn

from lightning_fedcluster.engine.batched_steps import (
    SGDConfig,
    batched_e_step,
    cluster_losses,
    engine_batches,
    expand_clients,
    functional_template,
    local_sgd,
    pad_clients,
    stack_models,
)
from lightning_fedcluster.models import FashionCNN, MLPClassifier

K = 3


def workload(name: str) -> tuple[Callable[[], nn.Module], Tensor, Tensor, Tensor, int, int, int]:
    """(model factory, x, y, client offsets, classes, batch size, client chunk) of a named workload."""
    generator = torch.Generator().manual_seed(0)
    if name == "linear":  # W2: FedEM synthetic sizes, linear 150 -> 2
        from lightning_fedcluster.datamodules import FedEMSynthetic

        dm = FedEMSynthetic(seed=0)
        factory = lambda: MLPClassifier(150, 2, hidden=(), lr=0.1)  # noqa: E731
        return factory, dm.train_x, dm.train_y, dm.train_offsets, 2, 128, 300
    if name == "mlp":  # digits-sized MLP 64-128-10, 100 clients x 50 samples, batch 32
        sizes = [50] * 100
        x = torch.rand(sum(sizes), 64, generator=generator)
        factory, classes, batch, chunk = (lambda: MLPClassifier(64, 10, hidden=(128,), lr=0.1)), 10, 32, 100
    else:  # W1: FashionCNN, 30 clients x 180 samples, batch 128
        sizes = [180] * 30
        x = torch.rand(sum(sizes), 1, 28, 28, generator=generator)
        factory, classes, batch, chunk = (lambda: FashionCNN(lr=0.01)), 10, 128, 5
    y = torch.randint(0, classes, (sum(sizes),), generator=generator)
    return factory, x, y, torch.tensor([0, *sizes]).cumsum(0), classes, batch, chunk


def loop_round(
    models: list[nn.Module],
    x: Tensor,
    y: Tensor,
    offsets: Tensor,
    orders: list[Tensor],
    batch: int,
    lr: float,
) -> tuple[float, float, list[list[nn.Module]]]:
    """Per client: E-step (K forwards, responsibilities) then local SGD; returns the seconds of each."""
    work = [copy.deepcopy(m) for m in models]
    e_seconds = t_seconds = 0.0
    results = []
    for c in range(offsets.numel() - 1):
        start = clock()
        xc, yc = x[int(offsets[c]) : int(offsets[c + 1])], y[int(offsets[c]) : int(offsets[c + 1])]
        n = yc.shape[0]
        with torch.no_grad():
            for w, m in zip(work, models, strict=True):
                for p, q in zip(w.parameters(), m.parameters(), strict=True):
                    p.copy_(q)
                w.eval()
            losses = torch.stack([F.cross_entropy(w(xc), yc, reduction="none") for w in work], 1).double()
            gamma = torch.softmax(math.log(1 / K) - losses, 1).float()
            for w in work:
                w.train()
        middle = clock()
        optimizer = torch.optim.SGD([p for w in work for p in w.parameters()], lr=lr)
        size = min(batch, n)
        for step in range(math.ceil(n / batch)):
            index = orders[c][(step * size + torch.arange(size)) % n]
            optimizer.zero_grad()
            xb, yb = xc[index], yc[index]
            total = sum(
                (gamma[index, k] * F.cross_entropy(work[k](xb), yb, reduction="none")).sum() / size
                for k in range(K)
            )
            total.backward()
            optimizer.step()
        t_seconds += clock() - middle
        e_seconds += middle - start
        if c == 0:
            results.append([copy.deepcopy(w) for w in work])
    return e_seconds, t_seconds, results


def group_clients(steps: Tensor, chunk: int) -> list[Tensor]:
    """Client indices grouped by their number of local steps, each group cut into chunks."""
    groups = []
    for value in steps.unique().tolist():
        members = (steps == value).nonzero().flatten()
        groups.extend(members[i : i + chunk] for i in range(0, members.numel(), chunk))
    return groups


def vectorised_round(
    models: list[nn.Module],
    x: Tensor,
    y: Tensor,
    offsets: Tensor,
    orders: list[Tensor],
    batch: int,
    lr: float,
    classes: int,
    chunk: int,
) -> tuple[float, float, dict[str, Tensor]]:
    """All clients' E-step at once, then the local SGD of all pairs in chunks of ``chunk`` clients."""
    start = clock()
    params, buffers = stack_models(models)
    template = functional_template(models[0]).eval()
    losses, _ = cluster_losses(template, params, buffers, x, y)
    padded, mask = pad_clients(losses.double(), offsets)
    labels, _ = pad_clients(y, offsets)
    count = offsets.numel() - 1
    log_omega = torch.full((count, K), math.log(1 / K), dtype=torch.float64)
    gamma, _, _ = batched_e_step(padded, labels, mask, log_omega, None, classes)
    weights = gamma[mask].float()
    middle = clock()
    template.train()
    config = SGDConfig(lr=lr)
    steps = torch.div(offsets.diff() + batch - 1, batch, rounding_mode="floor")
    first = None
    # Clients with the same number of steps run together (no masked steps), in chunks.
    for group in group_clients(steps, chunk):
        index = torch.cat([torch.arange(int(offsets[c]), int(offsets[c + 1])) for c in group.tolist()])
        sub_offsets = torch.cat([torch.zeros(1, dtype=torch.long), offsets.diff()[group].cumsum(0)])
        batches = engine_batches(
            x[index], y[index], weights[index], sub_offsets, [orders[c] for c in group], steps[group], batch
        )
        final = local_sgd(template, expand_clients(params, group.numel()), buffers, batches, config)
        if 0 in group.tolist():
            first = {n: p[(group == 0).nonzero().flatten()[:1]] for n, p in final.items()}
    assert first is not None
    return middle - start, clock() - middle, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["linear", "mlp", "cnn"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    parser.add_argument("--threads", type=int, default=0, help="torch threads with --clock wall (0: default)")
    args = parser.parse_args()
    quiet()
    if args.threads:
        set_threads(args.threads)
    set_clock(args.clock)
    torch.manual_seed(0)
    rows = []
    for name in args.workloads:
        factory, x, y, offsets, classes, batch, chunk = workload(name)
        models = [factory() for _ in range(K)]
        lr = 0.1 if name != "cnn" else 0.01
        generator = torch.Generator().manual_seed(1)
        orders = [torch.randperm(int(n), generator=generator) for n in offsets.diff()]
        loop_times, vec_times = [], []
        for _ in range(args.repeats):
            e, t, reference = loop_round(models, x, y, offsets, orders, batch, lr)
            loop_times.append((e, t))
            e, t, first = vectorised_round(models, x, y, offsets, orders, batch, lr, classes, chunk)
            vec_times.append((e, t))
        difference = max(
            float((first[n][0, k] - p.detach()).abs().max())
            for k in range(K)
            for n, p in reference[0][k].named_parameters()
        )
        loop_e, loop_t = (statistics.median(v[i] for v in loop_times) for i in (0, 1))
        vec_e, vec_t = (statistics.median(v[i] for v in vec_times) for i in (0, 1))
        steps = int(torch.div(offsets.diff() + batch - 1, batch, rounding_mode="floor").sum())
        rows.append((name, offsets.numel() - 1, steps, loop_e, vec_e, loop_t, vec_t, difference))
    print(machine_line())
    print(f"command: {command_line()}")
    print(f"K={K}, one local epoch per client, median of {args.repeats} rounds; seconds per round")
    print(
        f"{'workload':<10}{'clients':>8}{'steps':>7}{'E loop':>9}{'E vec':>9}{'x':>6}{'train loop':>12}"
        f"{'train vec':>11}{'x':>6}{'max |diff|':>12}"
    )
    for name, clients, steps, le, ve, lt, vt, diff in rows:
        print(
            f"{name:<10}{clients:>8}{steps:>7}{le:>9.3f}{ve:>9.3f}{le / ve:>6.1f}{lt:>12.3f}{vt:>11.3f}"
            f"{lt / vt:>6.1f}{diff:>12.1e}"
        )


if __name__ == "__main__":
    main()
