"""Evaluation scaling: wall time of validating 2,000 and 10,000 clients against one training round
over 200 clients of the same data (target: validating 2,000 clients <= 3x a 200-client round).

Data: 8x8 digits features (scikit-learn's digits, 64 features in [0, 1], resampled with
replacement), every client a small train and test split (default 20 train / 10 test samples),
plus the datamodule's global test clients (default 3 x 120 samples). Model: MLPClassifier
(64-128-10), K = 3 FedRC with the strategy's defaults (5 local steps of batch 32, full
participation) and the chosen executor ("auto" by default, the vectorised one for this MLP).

The training round is measured on the first 200 clients: ``--warmup`` rounds, then the median of
``--rounds`` rounds (no validation in the fit). The trained module is then validated with
``trainer.validate(module, datamodule=dm)`` on N clients (the first 200 are the trained ones).
The "eval" column is the time of that call, Lightning's loop included; the engine's own timer
(``phase_seconds["evaluation"]``: the client evaluations alone) is shown beside it. Times are CPU
seconds of this process with one torch thread by default (the machine is shared and wall time
swings with other jobs' load; on an idle machine the two agree), ``--clock wall`` for wall
seconds. Only the public API is used: Trainer, FederatedDataModule, FedRCStrategy,
ClusteredModule and MLPClassifier.

    OMP_NUM_THREADS=1 python benchmarks/eval_scaling.py --clients 2000 10000
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import (
    CLOCK_HELP,
    RoundTimer,
    clock,
    command_line,
    machine_line,
    make_trainer,
    quiet,
    set_clock,
    set_threads,
    summarise,
)

from lightning_fedcluster import ClusteredModule, FederatedDataModule, FedRCStrategy
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.models import MLPClassifier

TARGET_RATIO = 3.0  # validating 2,000 clients <= 3x one 200-client training round
TRAIN_CLIENTS = 200


def digits_datamodule(num_clients: int, train_size: int, test_size: int, global_clients: int,
                      global_size: int, seed: int) -> FederatedDataModule:
    """``num_clients`` clients of digits rows drawn with replacement, plus the global test clients.
    Client i's data does not depend on ``num_clients`` (the first 200 clients of every size are
    the ones the training round used)."""
    x, y = load_digits_tensors()

    def draw(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.randint(0, x.shape[0], (count,), generator=generator)
        return x[rows], y[rows]

    clients = torch.Generator().manual_seed(seed)
    train, test = [], []
    for _ in range(num_clients):
        cx, cy = draw(train_size + test_size, clients)
        train.append((cx[:train_size], cy[:train_size]))
        test.append((cx[train_size:], cy[train_size:]))
    held = torch.Generator().manual_seed(seed + 1)
    global_test = [draw(global_size, held) for _ in range(global_clients)]
    return FederatedDataModule(train, test, global_test, num_classes=10, batch_size=32)


def strategy_for(args: argparse.Namespace) -> FedRCStrategy:
    return FedRCStrategy(3, seed=args.seed, executor=args.executor)


def to_device(module: ClusteredModule, device: str) -> None:
    """Put the module on the GPU before a cuda run: the engine's setup runs the models once on a
    sample (its output-shape check) before Lightning moves them, and at commit 6ce935c a fit or
    validate on cuda fails there with the module on the CPU."""
    if device == "cuda":
        module.to("cuda")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[2000, 10000], help="clients validated")
    parser.add_argument("--train-size", type=int, default=20, help="training samples per client")
    parser.add_argument("--test-size", type=int, default=10, help="test samples per client")
    parser.add_argument("--global-clients", type=int, default=3)
    parser.add_argument("--global-size", type=int, default=120, help="samples per global test client")
    parser.add_argument("--rounds", type=int, default=3, help="measured training rounds (median)")
    parser.add_argument("--warmup", type=int, default=1, help="training rounds before the measured ones")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--executor", default="auto", choices=("auto", "loop", "vectorized"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="Trainer accelerator")
    parser.add_argument("--threads", type=int, default=1, help="torch threads with --clock wall (0: default)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    parser.add_argument("--repeats", type=int, default=1, help="validations per client count (median)")
    args = parser.parse_args()
    quiet()
    if args.threads:
        set_threads(args.threads)
    set_clock(args.clock)
    sizes = (args.train_size, args.test_size, args.global_clients, args.global_size, args.seed)

    # One training round over 200 clients (median of the measured rounds, wall seconds).
    module = ClusteredModule(MLPClassifier(lr=0.1), 3, seed=args.seed)
    to_device(module, args.device)
    timer = RoundTimer()
    trainer = make_trainer(strategy_for(args), args.warmup + args.rounds, validate=False, callbacks=[timer],
                           accelerator=args.device)
    trainer.fit(module, datamodule=digits_datamodule(TRAIN_CLIENTS, *sizes))
    round_seconds = summarise(timer.rounds, args.warmup)["round"]
    executor = module.executor

    rows = []
    for clients in args.clients:
        dm = digits_datamodule(clients, *sizes)
        runs = []
        for _ in range(args.repeats):
            trainer = make_trainer(strategy_for(args), 1, validate=True, accelerator=args.device)
            to_device(module, args.device)  # Lightning hands the module back on the CPU after each run
            before = module.phase_seconds["evaluation"]
            start = clock()
            trainer.validate(module, datamodule=dm, verbose=False)
            runs.append((clock() - start, module.phase_seconds["evaluation"] - before))
        evaluated = int((dm.test_sizes > 0).sum()) + dm.num_global_clients
        accuracy = module.eval_metrics.get("val/local_acc", float("nan"))
        rows.append((clients, evaluated, statistics.median(r[0] for r in runs),
                     statistics.median(r[1] for r in runs), accuracy))

    print(machine_line())
    print(f"command: {command_line()}")
    print(f"eval scaling: digits features [64], {args.train_size} train / {args.test_size} test samples per "
          f"client + {args.global_clients} global clients x {args.global_size}; MLPClassifier 64-128-10, K=3 "
          f"FedRC (defaults: 5 local steps of batch 32, all clients), executor {executor}, device "
          f"{args.device}; training round: {TRAIN_CLIENTS} clients, median of {args.rounds} rounds after "
          f"{args.warmup} warm-up; eval: trainer.validate of the trained module, median of {args.repeats}")
    print(f"{'clients':>8}{'evaluated':>10}{'eval s':>10}{'engine s':>10}{'ms/client':>10}"
          f"{f'round({TRAIN_CLIENTS}) s':>14}{'ratio':>9}{'target':>8}{'local acc':>10}")
    for clients, evaluated, seconds, engine, accuracy in rows:
        target = f"<= {TARGET_RATIO:g}" if clients == 2000 else "-"
        print(f"{clients:>8}{evaluated:>10}{seconds:>10.2f}{engine:>10.2f}{1000 * seconds / evaluated:>10.2f}"
              f"{round_seconds:>14.3f}{seconds / round_seconds:>9.1f}{target:>8}{accuracy:>10.3f}")
    print("eval s: time of trainer.validate (Lightning's loop included); engine s: the module's "
          "phase_seconds['evaluation'] (client evaluations only); ratio = eval s / round s")


if __name__ == "__main__":
    main()
