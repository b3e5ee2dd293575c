"""Where a FedAvg round's CPU seconds go: the W1 workload of ``flower_app_side_by_side.py`` (30
clients x 180 digits-28 rows, FashionCNN, batch 128, SGD lr 0.05 momentum 0.9, one local epoch)
in one process, one torch thread, CPU seconds of this process.

Three rows, rounds interleaved (each library round is followed by one round of each other row, so
that all see the same machine state):

- this library: ``lightning.pytorch.Trainer`` + ``FedAvgStrategy(local_epochs=1)``, the loop
  executor, validation off; the engine's phase timers split each round;
- the Flower app's client work: ``_flower_app.local_train`` (the ``ClientApp``'s own loop: a
  model built per client, its weights loaded, a shuffled ``DataLoader``, a fresh SGD, one epoch)
  called in this process for every client, then the weighted average of the replies (Flower's
  FedAvg arithmetic); no Flower, no Ray, no messages;
- the kernels alone: the same minibatch steps on one model with no framework (weights copied in,
  ``index_select`` batches, SGD), the floor of the round.

Then a CPU-clock cProfile of ``--profile-rounds`` library rounds attributes the library's round
to its parts (the per-client no-grad pass, the training metrics, weight copies, the reply checks,
the accumulation, Lightning's loop). cProfile's own cost inflates Python-heavy parts.

    OMP_NUM_THREADS=1 python benchmarks/fedavg_round_profile.py --rounds 4
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import math
import pstats
import statistics
import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from _common import RoundTimer, command_line, machine_line, make_trainer, quiet, set_clock
from _flower_app import build_model, local_train
from flower_app_side_by_side import initial_weights, w1_data

from lightning_fedcluster import ClusteredModule, FedAvgStrategy, FederatedDataModule
from lightning_fedcluster.models import FashionCNN

LR, MOMENTUM, BATCH = 0.05, 0.9, 128

# (label, file suffix, function): cumulative CPU seconds of these calls, per round
PARTS = (
    ("client turns (loop executor)", "executors/loop.py", "train_client"),
    ("  start: no-grad pass over the rows", "engine/losses.py", "evaluate_models"),
    ("  start: E-step + plan (prepare)", "engine/client.py", "prepare"),
    ("  start: training metrics", "engine/client.py", "train_metric_sums"),
    ("  start: global weights into the copy", "engine/copies.py", "load"),
    ("  start: heap trim", "lightning_fedcluster/allocator.py", "release_free_heap"),
    ("  local steps (forward, backward, SGD)", "executors/loop.py", "turn_step"),
    ("    of which backward", "torch/_tensor.py", "backward"),
    ("    of which optimizer step", "torch/optim/optimizer.py", "wrapper"),
    ("  end: reply checks", "engine/round.py", "admit"),
    ("  end: float64 accumulation", "engine/round.py", "accumulate"),
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
        for i, (x, y) in enumerate(self.clients):
            config = {"model": "cnn", "lr": LR, "momentum": MOMENTUM, "batch-size": BATCH, "local-epochs": 1,
                      "seed": self.seed, "server-round": self.round}  # fmt: skip
            state, _ = local_train(self.weights, torch.utils.data.TensorDataset(x, y), config, i)
            replies.append((state, len(y)))
        trained = time.process_time()
        total = sum(n for _, n in replies)
        self.weights = {k: sum(s[k] * (n / total) for s, n in replies) for k in self.weights}
        done = time.process_time()
        return {"round": done - start, "local_training": trained - start, "aggregation": done - trained}


class Kernels:
    """The round's minibatch steps on one model, nothing else."""

    def __init__(self, initial: dict[str, torch.Tensor], clients: list, seed: int) -> None:
        self.model = build_model("cnn")
        self.model.load_state_dict(initial)
        self.globals = [p.detach().clone() for p in self.model.parameters()]
        self.clients, self.generator = clients, torch.Generator().manual_seed(seed)

    def run_round(self) -> dict[str, float]:
        start = time.process_time()
        params = list(self.model.parameters())
        sums = [torch.zeros_like(g) for g in self.globals]
        for x, y in self.clients:
            with torch.no_grad():
                for p, g in zip(params, self.globals, strict=True):
                    p.copy_(g)
            optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
            order = torch.randperm(len(y), generator=self.generator)
            for s in range(math.ceil(len(y) / BATCH)):
                index = order[s * BATCH : (s + 1) * BATCH]
                optimizer.zero_grad()
                F.cross_entropy(self.model(x[index]), y[index]).backward()
                optimizer.step()
            with torch.no_grad():
                for a, p in zip(sums, params, strict=True):
                    a.add_(p, alpha=len(y))
        rows = sum(len(y) for _, y in self.clients)
        self.globals = [a / rows for a in sums]
        return {"round": time.process_time() - start}


class Interleaved(pl.Callback):
    """After every library round, one round of each plain row (outside the library's timer)."""

    def __init__(self, others: dict[str, Any]) -> None:
        self.others = others
        self.rows: dict[str, list[dict[str, float]]] = {name: [] for name in others}

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name, other in self.others.items():
            self.rows[name].append(other.run_round())


def library(clients: list, initial: dict[str, torch.Tensor], seed: int, rounds: int,
            callbacks: list) -> ClusteredModule:  # fmt: skip
    module = ClusteredModule(FashionCNN(lr=LR, momentum=MOMENTUM), 1, seed=seed)
    module.models[0].load_state_dict(initial)
    tests = [(x[:1], y[:1]) for x, y in clients]
    dm = FederatedDataModule(clients, tests, batch_size=BATCH, seed=seed)
    strategy = FedAvgStrategy(local_epochs=1, seed=seed, executor="loop")
    trainer = make_trainer(strategy, rounds, validate=False, callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    return module


def median_of(rows: list[dict[str, float]], key: str, warmup: int) -> float:
    kept = rows[warmup:] or rows
    return statistics.median(r.get(key, 0.0) for r in kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds; the first is left out of the medians")
    parser.add_argument(
        "--profile-rounds", type=int, default=2, help="library rounds under cProfile (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quiet()
    set_clock("cpu")
    clients, _, _ = w1_data()
    initial = initial_weights("cnn", args.seed)
    timer = RoundTimer()
    others = {
        "plain": PlainFedAvg(initial, clients, args.seed),
        "kernels": Kernels(initial, clients, args.seed),
    }
    interleaved = Interleaved(others)
    library(clients, initial, args.seed, args.rounds, [timer, interleaved])
    print(machine_line())
    print(f"command: {command_line()}")
    print(f"W1, FedAvg: {len(clients)} clients x 180 rows, FashionCNN, batch {BATCH}, one local epoch; "
          f"median of rounds 2-{args.rounds}, CPU seconds of this process, rounds interleaved")  # fmt: skip
    keys = ("round", "e_step", "local_training", "aggregation", "other")
    print(f"{'':<44}" + "".join(f"{k:>15}" for k in keys))
    print(
        f"{'this library (loop executor)':<44}"
        + "".join(f"{median_of(timer.rounds, k, 1):>15.3f}" for k in keys)
    )
    names = {"plain": "Flower app's client loop, in-process", "kernels": "the kernels alone"}
    for name, rows in interleaved.rows.items():
        print(f"{names[name]:<44}" + "".join(f"{median_of(rows, k, 1):>15.3f}" for k in keys))
    pairs = zip(timer.rounds, interleaved.rows["plain"], strict=True)
    ratios = [e["round"] / p["round"] for e, p in pairs][1:]
    print(f"library / Flower app's client loop, paired rounds: median {statistics.median(ratios):.3f}")
    if args.profile_rounds:
        profile(clients, initial, args.seed, args.profile_rounds)


def profile(clients: list, initial: dict[str, torch.Tensor], seed: int, rounds: int) -> None:
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

    library(clients, copy.deepcopy(initial), seed, rounds + 1, [Profiled()])
    stats = pstats.Stats(profiler)
    per_round = sum(epochs) / len(epochs)
    print(f"\ncProfile of {rounds} library rounds (CPU clock): {per_round:.3f} s a round under the profiler")
    print(f"{'part':<44}{'s/round':>10}{'share':>8}")
    for label, suffix, function in PARTS:
        seconds = (
            sum(
                row[3]
                for (path, _, name), row in stats.stats.items()
                if name == function and path.endswith(suffix)
            )
            / rounds
        )
        print(f"{label:<44}{seconds:>10.3f}{seconds / per_round:>8.1%}")


if __name__ == "__main__":
    main()
