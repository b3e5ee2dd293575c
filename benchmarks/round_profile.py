"""Where a round's CPU seconds go, one process, one torch thread, CPU seconds of this process.

Two workloads (``--workload``):

- ``w1`` (default): W1 of ``flower_app_side_by_side.py`` with FedAvg (30 clients x 180 digits-28
  rows, FashionCNN, batch 128, SGD lr 0.05 momentum 0.9, one local epoch);
- ``authors``: the authors' FashionMNIST-C recipe on a scenario ``authors_comparison.py write``
  made (``--data``; 25 clients x 160 rows, FedRC K = 3, one local step of 128 rows, SGD lr 0.06,
  momentum 0.9, weight decay 5e-4, the optimizer state kept per client), as
  ``training_round.md`` measures it, without the per-round evaluation.

Rows, rounds interleaved (each library round is followed by one round of each other row, so that
all see the same machine state):

- this library: ``lightning.pytorch.Trainer`` and the workload's strategy, the loop executor,
  validation off; the engine's phase timers split each round;
- (``w1``) the Flower app's client work: ``_flower_app.local_train`` (the ``ClientApp``'s own
  loop: a model built per client, its weights loaded, a shuffled ``DataLoader``, a fresh SGD, one
  epoch) called in this process for every client, then the weighted average of the replies
  (Flower's FedAvg arithmetic); no Flower, no Ray, no messages;
- the kernels alone: the round's forward and backward passes and SGD steps with no framework
  (weights copied in, indexed batches, a float32 sum of the results): the floor of the round.

Then a CPU-clock cProfile of ``--profile-rounds`` library rounds attributes the library's round
to its parts (the per-client no-grad pass, the training metrics, weight copies, the optimizer
state, the reply checks, the accumulation, Lightning's loop) and lists the functions with the
most time of their own. cProfile's own cost inflates Python-heavy parts.

    OMP_NUM_THREADS=1 python benchmarks/round_profile.py --rounds 4
    OMP_NUM_THREADS=1 python benchmarks/round_profile.py --workload authors --data takeoff-data/a1 --rounds 4
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from _common import RoundTimer, command_line, machine_line, make_trainer, quiet, set_clock
from _flower_app import build_model, local_train
from flower_app_side_by_side import initial_weights, w1_data

from lightning_fedcluster import ClusteredModule, FedAvgStrategy, FederatedDataModule
from lightning_fedcluster.models import FashionCNN

W1 = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "batch": 128, "clusters": 1, "pass": False}
AUTHORS = {"lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4, "batch": 128, "clusters": 3, "pass": True}

# (label, file suffix, function): cumulative CPU seconds of these calls, per round
PARTS = (
    ("client turns (loop executor)", "executors/loop.py", "train_client"),
    ("  start: no-grad pass over the rows", "engine/losses.py", "evaluate_models"),
    ("  start: E-step + plan (prepare)", "engine/client.py", "prepare"),
    ("  start: training metrics of the pass", "engine/client.py", "train_metric_sums"),
    ("  start: global weights into the copies", "engine/copies.py", "load"),
    ("  start: optimizer state into the solver", "engine/optimizer_state.py", "load_state"),
    ("  start: heap trim", "lightning_fedcluster/allocator.py", "release_free_heap"),
    ("  local steps (forward, backward, SGD)", "executors/loop.py", "turn_step"),
    ("    of which backward", "torch/_tensor.py", "backward"),
    ("    of which optimizer step", "torch/optim/optimizer.py", "wrapper"),
    ("    of which training metrics of the steps", "engine/client.py", "step_metric_sums"),
    ("  end: reply checks", "engine/round.py", "admit"),
    ("  end: float64 accumulation", "engine/round.py", "accumulate"),
    ("  end: optimizer state out of the solver", "engine/optimizer_state.py", "read_state"),
    ("server: apply the average", "engine/round.py", "apply"),
    ("the round in the engine", "engine/federation.py", "run_round"),
)


class PlainFedAvg:
    """The Flower app's client work and FedAvg aggregation, in this process."""

    def __init__(self, initial: dict[str, torch.Tensor], clients: list, seed: int) -> None:
        self.weights = {k: v.clone() for k, v in initial.items()}
        self.clients, self.seed, self.round = clients, seed, 0

    def run_round(self) -> dict[str, float]:
        self.round += 1
        replies, start = [], time.process_time()
        config = {"model": "cnn", "lr": W1["lr"], "momentum": W1["momentum"], "batch-size": W1["batch"],
                  "local-epochs": 1, "seed": self.seed, "server-round": self.round}  # fmt: skip
        for i, (x, y) in enumerate(self.clients):
            state, _ = local_train(self.weights, torch.utils.data.TensorDataset(x, y), config, i)
            replies.append((state, len(y)))
        trained = time.process_time()
        total = sum(n for _, n in replies)
        self.weights = {k: sum(s[k] * (n / total) for s, n in replies) for k in self.weights}
        done = time.process_time()
        return {"round": done - start, "local_training": trained - start, "aggregation": done - trained}


class Kernels:
    """The round's passes and steps on K models, nothing else: per client and model, the global
    weights copied in, (with ``pass``) a no-grad eval-mode forward over the client's rows, its
    local steps (one epoch of batches, or ``steps`` batches), a float32 sum of the results."""

    def __init__(self, initial: dict[str, torch.Tensor], clients: list, seed: int, spec: dict[str, Any],
                 steps: int | None = None) -> None:  # fmt: skip
        self.model = build_model("cnn")
        self.model.load_state_dict(initial)
        params = [p.detach().clone() for p in self.model.parameters()]
        self.globals = [[p.clone() for p in params] for _ in range(spec["clusters"])]
        self.clients, self.spec, self.steps = clients, spec, steps
        self.generator = torch.Generator().manual_seed(seed)

    def run_round(self) -> dict[str, float]:
        start, spec = time.process_time(), self.spec
        params = list(self.model.parameters())
        sums = [[torch.zeros_like(g) for g in cluster] for cluster in self.globals]
        for x, y in self.clients:
            order = torch.randperm(len(y), generator=self.generator)
            steps = self.steps or math.ceil(len(y) / spec["batch"])
            for cluster, total in zip(self.globals, sums, strict=True):
                with torch.no_grad():
                    for p, g in zip(params, cluster, strict=True):
                        p.copy_(g)
                    if spec["pass"]:
                        self.model.eval()
                        F.cross_entropy(self.model(x), y, reduction="none")
                        self.model.train()
                optimizer = torch.optim.SGD(
                    params, lr=spec["lr"], momentum=spec["momentum"], weight_decay=spec["weight_decay"]
                )
                for s in range(steps):
                    index = order[s * spec["batch"] : (s + 1) * spec["batch"]]
                    optimizer.zero_grad()
                    F.cross_entropy(self.model(x[index]), y[index]).backward()
                    optimizer.step()
                with torch.no_grad():
                    for a, p in zip(total, params, strict=True):
                        a.add_(p, alpha=len(y))
        rows = sum(len(y) for _, y in self.clients)
        self.globals = [[a / rows for a in total] for total in sums]
        return {"round": time.process_time() - start}


class Interleaved(pl.Callback):
    """After every library round, one round of each other row (outside the library's timer)."""

    def __init__(self, others: dict[str, Any]) -> None:
        self.others = others
        self.rows: dict[str, list[dict[str, float]]] = {name: [] for name in others}

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name, other in self.others.items():
            self.rows[name].append(other.run_round())


def w1_fit(clients: list, initial: dict[str, torch.Tensor], seed: int) -> Callable[[int, list], None]:
    """A W1 FedAvg fit of ``rounds`` rounds with ``callbacks``."""

    def fit(rounds: int, callbacks: list) -> None:
        module = ClusteredModule(FashionCNN(lr=W1["lr"], momentum=W1["momentum"]), 1, seed=seed)
        module.models[0].load_state_dict(initial)
        tests = [(x[:1], y[:1]) for x, y in clients]
        dm = FederatedDataModule(clients, tests, batch_size=W1["batch"], seed=seed)
        strategy = FedAvgStrategy(local_epochs=1, seed=seed, executor="loop")
        make_trainer(strategy, rounds, validate=False, callbacks=callbacks).fit(module, datamodule=dm)

    return fit


def authors_fit(data: str, seed: int) -> tuple[Callable[[int, list], None], list]:
    """The authors' recipe (``authors_comparison.py run --optimizer-state persist``) as a fit, and
    the scenario's clients."""
    from authors_comparison import authors_model, make_strategy, read

    dm, _, _ = read(Path(data))
    clients = [dm.train_split(i) for i in range(dm.num_clients)]

    def fit(rounds: int, callbacks: list) -> None:
        torch.manual_seed(seed)
        model, _ = authors_model()
        strategy, _ = make_strategy("persist", seed, {"executor": "loop"})
        make_trainer(strategy, rounds, validate=False, callbacks=callbacks).fit(model, datamodule=dm)

    return fit, clients


def median_of(rows: list[dict[str, float]], key: str, warmup: int) -> float:
    kept = rows[warmup:] or rows
    return statistics.median(r.get(key, 0.0) for r in kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("w1", "authors"), default="w1")
    parser.add_argument("--data", help="with --workload authors: a scenario of authors_comparison.py write")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; the first is left out of the medians")
    parser.add_argument("--profile-rounds", type=int, default=2, help="rounds under cProfile (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quiet()
    set_clock("cpu")
    if args.workload == "w1":
        clients, _, _ = w1_data()
        initial = initial_weights("cnn", args.seed)
        fit = w1_fit(clients, initial, args.seed)
        others = {"plain": PlainFedAvg(initial, clients, args.seed), "kernels": Kernels(initial, clients,
                  args.seed, W1)}  # fmt: skip
        title = f"W1, FedAvg: {len(clients)} clients x 180 rows, FashionCNN, batch 128, one local epoch"
    else:
        if not args.data:
            raise SystemExit("--workload authors needs --data DIR (authors_comparison.py write --out DIR)")
        fit, clients = authors_fit(args.data, args.seed)
        others = {"kernels": Kernels(initial_weights("cnn", args.seed), clients, args.seed, AUTHORS, steps=1)}
        title = (f"the authors' recipe: {len(clients)} clients x {len(clients[0][1])} rows, FashionCNN, "
                 "FedRC K=3, one local step of 128, optimizer state kept, float32")  # fmt: skip
    timer = RoundTimer()
    interleaved = Interleaved(others)
    fit(args.rounds, [timer, interleaved])
    print(machine_line())
    print(f"command: {command_line()}")
    print(f"{title}; median of rounds 2-{args.rounds}, CPU seconds of this process, rounds interleaved")
    keys = ("round", "e_step", "local_training", "aggregation", "other")
    print(f"{'':<40}" + "".join(f"{k:>15}" for k in keys))
    print(
        f"{'this library (loop executor)':<40}"
        + "".join(f"{median_of(timer.rounds, k, 1):>15.3f}" for k in keys)
    )
    names = {"plain": "Flower app's client loop, in-process", "kernels": "the kernels alone"}
    for name, rows in interleaved.rows.items():
        print(f"{names[name]:<40}" + "".join(f"{median_of(rows, k, 1):>15.3f}" for k in keys))
        pairs = zip(timer.rounds, rows, strict=True)
        ratios = [mine["round"] / other["round"] for mine, other in pairs][1:]
        overhead = [mine["round"] - other["round"] for mine, other in zip(timer.rounds, rows, strict=True)][
            1:
        ]
        print(f"  library / {names[name]}, paired rounds: median {statistics.median(ratios):.3f}; "
              f"library - it: median {statistics.median(overhead):.3f} s")  # fmt: skip
    if args.profile_rounds:
        profile(fit, args.profile_rounds)


def profile(fit: Callable[[int, list], None], rounds: int, top: int = 15) -> None:
    """A cProfile (CPU clock) of ``rounds`` library rounds after one unprofiled round."""
    profiler = cProfile.Profile(time.process_time)
    epochs: list[float] = []

    class Profiled(pl.Callback):
        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if trainer.current_epoch >= 1:
                self.start = time.process_time()
                profiler.enable()

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if trainer.current_epoch >= 1:
                profiler.disable()
                epochs.append(time.process_time() - self.start)

    fit(rounds + 1, [Profiled()])
    stats = pstats.Stats(profiler)
    per_round = sum(epochs) / len(epochs)
    print(f"\ncProfile of {rounds} library rounds (CPU clock): {per_round:.3f} s a round under the profiler")
    print(f"{'part (cumulative)':<48}{'s/round':>10}{'share':>8}")
    for label, suffix, function in PARTS:
        found = [
            row[3]
            for (path, _, name), row in stats.stats.items()
            if name == function and path.endswith(suffix)
        ]
        seconds = sum(found) / rounds
        print(f"{label:<48}{seconds:>10.3f}{seconds / per_round:>8.1%}")
    print(f"\n{'the ' + str(top) + ' functions with most time of their own':<48}{'s/round':>10}{'share':>8}")
    own = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    for (path, line, name), row in own:
        label = f"{name} ({'/'.join(Path(path).parts[-2:])}:{line})" if line else name
        print(f"{label[:47]:<48}{row[2] / rounds:>10.3f}{row[2] / rounds / per_round:>8.1%}")


if __name__ == "__main__":
    main()
