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

``--per-round R`` measures the many-clients recipe instead, round by round: ``from_tensors`` on
2,000 clients x 20 rows of 64 features (``--data digits``: scikit-learn's digits drawn with
replacement; ``gaussian``: N(0, 1) features labelled by the argmax of the first ten, a task the
models learn), concepts=3 without corruption, FedRC(num_clusters=3, local_steps=2,
clients_per_round=200), validation of all 2,000 clients and the 3 global clients after every
round and once before training (round 0, the untrained models, where the K models are most
alike and the unseen clients' likelihood flattest). Each validation is compared with the
training round before it (round 0 with round 1); the training time excludes the validation
Lightning runs inside the epoch.

    OMP_NUM_THREADS=1 python benchmarks/eval_scaling.py --per-round 5 --data gaussian

``--flat`` times the unseen-client E-step alone (``algorithms.mixture.fit_mixture``) on flat
likelihoods: 1,600 rows, K = 3, the third model's likelihood nearly (0.3, 0.7) of the first two's
(a ridge of equally likely ω), for several spreads and noise levels, with the flat stop
(``flat_tolerance`` = FLAT_TOLERANCE) and without it (0: the certificate alone, as before).

    OMP_NUM_THREADS=1 python benchmarks/eval_scaling.py --flat
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import (
    CLOCK_HELP,
    RoundTimer,
    TrainValidateTimer,
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
RECIPE_CLIENTS = 2000


def digits_datamodule(
    num_clients: int, train_size: int, test_size: int, global_clients: int, global_size: int, seed: int
) -> FederatedDataModule:
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


def recipe_datamodule(data: str, seed: int) -> FederatedDataModule:
    """The many-clients recipe: ``from_tensors`` on 2,000 clients x 20 rows of 64 features."""
    generator = torch.Generator().manual_seed(seed)
    rows = RECIPE_CLIENTS * 20
    if data == "digits":
        x, y = load_digits_tensors()
        drawn = torch.randint(0, x.shape[0], (rows,), generator=generator)
        x, y = x[drawn], y[drawn]
    else:
        x = torch.randn(rows, 64, generator=generator)
        y = x[:, :10].argmax(1)
    return FederatedDataModule.from_tensors(
        x, y, num_clients=RECIPE_CLIENTS, concepts=3, corrupt_fraction=0, num_classes=10, seed=seed
    )


def per_round(args: argparse.Namespace) -> None:
    """The many-clients recipe round by round: validation of 2,000 clients against a 200-client round."""
    dm = recipe_datamodule(args.data, args.seed)
    strategy = FedRCStrategy(
        num_clusters=3, local_steps=2, clients_per_round=200, seed=args.seed, executor=args.executor
    )
    timer = TrainValidateTimer()
    trainer = make_trainer(
        strategy, args.per_round, validate=True, callbacks=[timer], num_sanity_val_steps=-1
    )
    module = ClusteredModule(MLPClassifier(lr=0.1), 3, seed=args.seed)
    trainer.fit(module, datamodule=dm)
    print(machine_line())
    print(f"command: {command_line()}")
    print(
        f"many-clients recipe: from_tensors, {RECIPE_CLIENTS} clients x 20 rows of 64 features "
        f"({args.data}), concepts=3, no corruption, {dm.num_global_clients} global clients; "
        f"MLPClassifier 64-128-10, FedRC(3, local_steps=2, clients_per_round=200), "
        f"executor {module.executor}; "
        f"validation: every client and global client, after each round and before training (round 0)"
    )
    print(f"{'round':>6}{'train s':>10}{'validate s':>12}{'ratio':>8}{'target':>8}")
    ratios = []
    for index, seconds in enumerate(timer.validate):
        train = timer.train[max(index - 1, 0)]  # round 0 (before training): against round 1
        ratios.append(seconds / train)
        target = f"<= {TARGET_RATIO:g}"
        print(f"{index:>6}{train:>10.3f}{seconds:>12.3f}{ratios[-1]:>8.2f}{target:>8}")
    accuracy = module.eval_metrics.get("val/local_acc", float("nan"))
    print(
        f"largest ratio {max(ratios):.2f}; ratio = validate s / train s of the round before (round 0: "
        f"round 1); last val/local_acc {accuracy:.3f}"
    )


def flat_estep() -> None:
    """The unseen-client E-step on ridge-shaped flat likelihoods, with and without the flat stop."""
    import warnings

    from lightning_fedcluster.algorithms.mixture import FLAT_TOLERANCE, fit_mixture

    print(machine_line())
    print(f"command: {command_line()}")
    print(
        "unseen-client E-step (fit_mixture) on 1,600 rows, K = 3: log-likelihoods s1, s2 ~ spread * N(0, 1), "
        "s3 = log(0.3 e^s1 + 0.7 e^s2) + noise * N(0, 1); iterations and seconds with the flat stop "
        f"(flat_tolerance {FLAT_TOLERANCE:g} nats) and without it (0); cap 5,000"
    )
    print(
        f"{'spread':>7}{'noise':>8}{'seed':>5}{'it (flat)':>10}{'s (flat)':>10}{'it (cert)':>10}"
        f"{'s (cert)':>10}{'ΔL nats':>10}"
    )
    totals = [0.0, 0.0]
    for spread in (1.0, 0.1, 0.01):
        for noise in (0.0, 1e-3, 1e-2):
            for seed in (0, 1):
                generator = torch.Generator().manual_seed(seed)
                two = spread * torch.randn(1600, 2, generator=generator, dtype=torch.float64)
                third = torch.logsumexp(two + torch.tensor([0.3, 0.7]).log(), 1, keepdim=True)
                third = third + noise * torch.randn(1600, 1, generator=generator, dtype=torch.float64)
                scores = torch.cat([two, third], 1)
                labels = torch.zeros(1600, dtype=torch.long)
                fits = []
                for tolerance in (FLAT_TOLERANCE, 0.0):
                    start = clock()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)  # the cap, reported in the table
                        fit = fit_mixture(-scores, labels, flat_tolerance=tolerance)
                    fits.append((fit, clock() - start))
                (flat, flat_s), (cert, cert_s) = fits
                totals[0] += flat_s
                totals[1] += cert_s
                lost = float(
                    torch.logsumexp(scores + cert.omega.clamp_min(0).log(), 1).sum()
                    - torch.logsumexp(scores + flat.omega.clamp_min(0).log(), 1).sum()
                )
                print(
                    f"{spread:>7g}{noise:>8g}{seed:>5}{flat.iterations:>10}{flat_s:>10.3f}{cert.iterations:>10}"
                    f"{cert_s:>10.3f}{lost:>10.1e}"
                )
    print(
        f"total seconds: flat stop {totals[0]:.2f}, certificate alone {totals[1]:.2f}; ΔL: total "
        "log-likelihood of the certificate's ω minus the flat stop's (what the early stop gives up)"
    )


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
    parser.add_argument("--per-round", type=int, default=0, help="rounds of the many-clients recipe (0: off)")
    parser.add_argument("--data", choices=("digits", "gaussian"), default="digits", help="--per-round data")
    parser.add_argument(
        "--flat", action="store_true", help="time the unseen-client E-step on flat likelihoods"
    )
    args = parser.parse_args()
    quiet()
    if args.threads:
        set_threads(args.threads)
    set_clock(args.clock)
    if args.per_round:
        per_round(args)
        return
    if args.flat:
        flat_estep()
        return
    sizes = (args.train_size, args.test_size, args.global_clients, args.global_size, args.seed)

    # One training round over 200 clients (median of the measured rounds, wall seconds).
    module = ClusteredModule(MLPClassifier(lr=0.1), 3, seed=args.seed)
    to_device(module, args.device)
    timer = RoundTimer()
    trainer = make_trainer(
        strategy_for(args),
        args.warmup + args.rounds,
        validate=False,
        callbacks=[timer],
        accelerator=args.device,
    )
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
        rows.append(
            (
                clients,
                evaluated,
                statistics.median(r[0] for r in runs),
                statistics.median(r[1] for r in runs),
                accuracy,
            )
        )

    print(machine_line())
    print(f"command: {command_line()}")
    print(
        f"eval scaling: digits features [64], {args.train_size} train / {args.test_size} test samples per "
        f"client + {args.global_clients} global clients x {args.global_size}; MLPClassifier 64-128-10, K=3 "
        f"FedRC (defaults: 5 local steps of batch 32, all clients), executor {executor}, device "
        f"{args.device}; training round: {TRAIN_CLIENTS} clients, median of {args.rounds} rounds after "
        f"{args.warmup} warm-up; eval: trainer.validate of the trained module, median of {args.repeats}"
    )
    print(
        f"{'clients':>8}{'evaluated':>10}{'eval s':>10}{'engine s':>10}{'ms/client':>10}"
        f"{f'round({TRAIN_CLIENTS}) s':>14}{'ratio':>9}{'target':>8}{'local acc':>10}"
    )
    for clients, evaluated, seconds, engine, accuracy in rows:
        target = f"<= {TARGET_RATIO:g}" if clients == 2000 else "-"
        print(
            f"{clients:>8}{evaluated:>10}{seconds:>10.2f}{engine:>10.2f}{1000 * seconds / evaluated:>10.2f}"
            f"{round_seconds:>14.3f}{seconds / round_seconds:>9.1f}{target:>8}{accuracy:>10.3f}"
        )
    print(
        "eval s: time of trainer.validate (Lightning's loop included); engine s: the module's "
        "phase_seconds['evaluation'] (client evaluations only); ratio = eval s / round s"
    )


if __name__ == "__main__":
    main()
