"""W1: seconds per round of FedRC through the public API against a bare PyTorch loop.

30 clients × 180 training samples (+45 local test samples each), FashionMNIST-shaped random
inputs [1, 28, 28] (timing does not depend on content), 10 classes, FashionCNN
(conv32-conv64-fc2048), K = 3, FedRCStrategy(local_epochs=1), batch 128 (2 local steps per
client), full participation, local test accuracy evaluated every round (train accuracy comes
from the E-step). Prints per-phase medians after warm-up, peak RSS and the engine / bare ratio.

    python benchmarks/w1_round_time.py --rounds 5 --warmup 1
"""

from __future__ import annotations

import argparse
import copy
import statistics

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
    w1_datamodule,
)

from lightning_fedcluster import ClusteredModule, FedRCStrategy
from lightning_fedcluster.models import FashionCNN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--samples", type=int, default=180, help="training samples per client")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    parser.add_argument("--threads", type=int, default=0, help="torch threads with --clock wall (0: default)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare PyTorch loop")
    parser.add_argument("--profile", help="write a cProfile of the engine's fit to this file")
    parser.add_argument("--executor", default="auto", choices=("auto", "loop", "vectorized"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="Trainer accelerator (the bare loop is CPU-only: cuda implies --no-bare)")
    args = parser.parse_args()
    quiet()
    if args.threads:
        set_threads(args.threads)
    set_clock(args.clock)
    total = args.warmup + args.rounds
    dm = w1_datamodule(args.clients, args.samples, args.samples // 4)
    module = ClusteredModule(FashionCNN(lr=0.01), 3, seed=0)
    initial = [copy.deepcopy(m) for m in module.models]
    timer = RoundTimer()
    callbacks: list = [timer]
    args.no_bare = args.no_bare or args.device != "cpu"
    if not args.no_bare:
        bare = InterleavedBare(BareFedRC(initial, dm, lr=0.01, local_epochs=1), evaluate=True)
        callbacks.append(bare)
    strategy = FedRCStrategy(3, local_epochs=1, seed=0, executor=args.executor)
    trainer = make_trainer(strategy, total, validate=True, callbacks=callbacks, accelerator=args.device)
    profiled(lambda: trainer.fit(module, datamodule=dm), args.profile)
    engine = summarise(timer.rounds, args.warmup)
    engine_rss = peak_rss_mb()

    print(machine_line())
    print(f"command: {command_line()}")
    print(f"W1: {args.clients} clients x {args.samples} train (+{args.samples // 4} test) samples, [1,28,28] "
          f"random inputs, FashionCNN, K=3 FedRC, batch 128, 1 local epoch, eval every round; "
          f"median of {args.rounds} rounds after {args.warmup} warm-up")
    print(header() + f"{'min':>10}")
    print(fmt_row(f"engine ({module.executor}, {args.device})", engine) + f"{engine['min_round']:>10.3f}")
    if not args.no_bare:
        reference = summarise(bare.rows, args.warmup)
        print(fmt_row("bare PyTorch loop", reference) + f"{reference['min_round']:>10.3f}")
        ratios = [e["round"] / b["round"] for e, b in zip(timer.rounds, bare.rows, strict=True)][args.warmup:]
        print(f"engine / bare, paired rounds (each engine round followed by a bare one): median "
              f"{statistics.median(ratios):.3f}, per round {' '.join(f'{r:.2f}' for r in ratios)}; "
              f"ratio of medians {engine['round'] / reference['round']:.3f} (target <= 1.25)")
    print(f"peak RSS after the engine's fit: {engine_rss:.0f} MB; at exit: {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
