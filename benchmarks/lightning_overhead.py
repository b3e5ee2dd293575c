"""What Lightning's bookkeeping costs per fit, before and after a round became one
Lightning batch (earlier commits ran one Lightning batch per client-step, or per chunk of
clients on the vectorised executor). A small fit (FedRC, DigitsFederated, 30 clients, 10 per
round, 5 local steps, MLP, 20 rounds, no validation) timed in this process, one warm-up then
``--repeats`` fits, CPU seconds and wall seconds. Run it from a checkout of each commit to
compare (the machine line is printed).

    OMP_NUM_THREADS=1 python benchmarks/lightning_overhead.py --executor loop
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import machine_line, make_trainer, quiet

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier


def fit_seconds(executor: str, rounds: int, dm: DigitsFederated) -> tuple[float, float]:
    strategy = lf.FedRCStrategy(3, clients_per_round=10, local_steps=5, executor=executor)
    trainer = make_trainer(strategy, rounds, validate=False)
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.fit(MLPClassifier(), datamodule=dm)
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executor", choices=["loop", "vectorized"], default="loop")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)
    dm = DigitsFederated(num_clients=30, concepts=3, seed=0)
    fit_seconds(args.executor, args.rounds, dm)  # warm-up
    runs = [fit_seconds(args.executor, args.rounds, dm) for _ in range(args.repeats)]
    print(machine_line())
    print(f"executor {args.executor}, {args.rounds} rounds x 10 clients x 5 local steps")
    print("cpu s  " + "  ".join(f"{cpu:.2f}" for cpu, _ in runs))
    print("wall s " + "  ".join(f"{wall:.2f}" for _, wall in runs))


if __name__ == "__main__":
    main()
