"""W2: seconds per round of FedEM on the FedEM paper's synthetic task.

FedEMSynthetic (300 clients, d = 150, binary, 3 components, Dirichlet(0.4) mixtures,
log-normal sizes, 80/20 train/test per client), linear model (MLPClassifier(hidden=()),
SGD lr 0.1), FedEMStrategy(3, local_epochs=1), batch 128, full participation. Two settings:
training only, and with local test accuracy evaluated every round. Each engine round is followed
by one round of a bare PyTorch loop doing the same passes (paired timing).

    python benchmarks/w2_fedem_synthetic.py --rounds 10 --warmup 2
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
from _bare import BareFedRC, InterleavedBare
from _common import (
    CLOCK_HELP,
    RoundTimer,
    command_line,
    fmt_row,
    header,
    machine_line,
    make_trainer,
    peak_rss_mb,
    profiled,
    quiet,
    set_clock,
    set_threads,
    summarise,
)

from lightning_fedcluster import ClusteredModule, FedEMStrategy
from lightning_fedcluster.datamodules import FedEMSynthetic
from lightning_fedcluster.models import MLPClassifier

LR = 0.1


def run(dm: FedEMSynthetic, rounds: int, warmup: int, *, validate: bool, bare: bool, executor: str = "auto",
        chunk: int | None = None, profile: str | None = None,
        device: str = "cpu") -> tuple[dict, dict | None, list[float]]:
    module = ClusteredModule(MLPClassifier(in_features=150, num_classes=2, hidden=(), lr=LR), 3, seed=0)
    timer = RoundTimer()
    callbacks: list = [timer]
    paired = None
    if bare:
        paired = InterleavedBare(BareFedRC([copy.deepcopy(m) for m in module.models], dm, lr=LR,
                                           use_label_stats=False), evaluate=validate)
        callbacks.append(paired)
    strategy = FedEMStrategy(3, local_epochs=1, seed=0, executor=executor, clients_per_chunk=chunk)
    trainer = make_trainer(strategy, warmup + rounds, validate=validate, callbacks=callbacks,
                           accelerator=device)
    profiled(lambda: trainer.fit(module, datamodule=dm), profile)
    engine = summarise(timer.rounds, warmup)
    engine["executor"] = module.executor
    if paired is None:
        return engine, None, []
    ratios = [e["round"] / b["round"] for e, b in zip(timer.rounds, paired.rows, strict=True)][warmup:]
    return engine, summarise(paired.rows, warmup), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    parser.add_argument("--threads", type=int, default=0, help="torch threads with --clock wall (0: default)")
    parser.add_argument("--no-bare", action="store_true")
    parser.add_argument("--executor", default="auto", choices=("auto", "loop", "vectorized"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="Trainer accelerator (the bare loop is CPU-only: cuda implies --no-bare)")
    parser.add_argument("--clients-per-chunk", type=int, help="vectorised work-item size (default: auto)")
    parser.add_argument("--profile", help="cProfile the training-only engine run into this file")
    args = parser.parse_args()
    quiet()
    if args.threads:
        set_threads(args.threads)
    set_clock(args.clock)
    dm = FedEMSynthetic(num_clients=args.clients, seed=0)
    steps = int(torch.div(dm.train_sizes + dm.batch_size - 1, dm.batch_size, rounding_mode="floor").sum())
    rows = []
    for validate in (False, True):
        engine, bare, ratios = run(dm, args.rounds, args.warmup, validate=validate,
                                   bare=not args.no_bare and args.device == "cpu",
                                   executor=args.executor, chunk=args.clients_per_chunk,
                                   profile=args.profile if not validate else None, device=args.device)
        rows.append(("with eval" if validate else "train only", engine, bare, ratios))
    print(machine_line())
    print(f"command: {command_line()}")
    print(f"W2: FedEM synthetic, {dm.num_clients} clients, {int(dm.train_sizes.sum())} train / "
          f"{int(dm.test_sizes.sum())} test samples, {steps} local steps per round, linear model, K=3, "
          f"batch 128, full participation; median of {args.rounds} rounds after {args.warmup} warm-up")
    print(header() + f"{'min':>10}")
    for name, engine, bare, ratios in rows:
        print(fmt_row(f"engine ({engine['executor']}), {name}", engine) + f"{engine['min_round']:>10.3f}")
        if bare is not None:
            print(fmt_row(f"bare loop, {name}", bare) + f"{bare['min_round']:>10.3f}")
            print(f"  engine / bare (paired rounds): median {statistics.median(ratios):.2f}")
        print(f"  engine per local step: {engine['round'] / steps * 1e3:.2f} ms (all phases), "
              f"target 0.25 s/round = {0.25 / steps * 1e3:.2f} ms/step")
    print(f"peak RSS: {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
