"""CPU seconds of a training round with and without ``reuse_estep_forward``, and how far apart
the two runs' weights end.

The workload has the shape of the authors' FashionMNIST-C recipe (``training_round.md``): 25
clients x 160 rows of digits-28 (scikit-learn's digits upsampled to 28 x 28), three concepts (the
labels as they are, 9 - y, y + 1 mod 10), FashionCNN, FedRC K = 3, one local step of 128 rows, SGD
lr 0.06, momentum 0.9, weight decay 5e-4, the optimizer state kept per client, the loop executor
(``--executor vectorized``: the vectorised one; ``--model mlp``: an MLP of 784-200-10 instead of
FashionCNN), no validation. One process, one torch thread,
CPU seconds of this process.

The machine may be shared, so the two settings run as pairs of fits, one after the other (off,
then on), and each pair gives one ratio of their median rounds (the first round of a fit left
out); the table quotes the medians of the pairs. Both fits of a pair start from the same weights
and seed, so the last columns say how far the option moved the results.

    OMP_NUM_THREADS=1 python benchmarks/estep_reuse.py --rounds 4 --pairs 3
    OMP_NUM_THREADS=1 python benchmarks/estep_reuse.py --rounds 3 --pairs 2 --executor vectorized
    OMP_NUM_THREADS=1 python benchmarks/estep_reuse.py --rounds 4 --pairs 3 --executor vectorized --model mlp
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import RoundTimer, command_line, machine_line, make_trainer, quiet, set_clock
from authors_data import digits_28

from lightning_fedcluster import FederatedDataModule, FedRCStrategy
from lightning_fedcluster.models import FashionCNN, MLPClassifier

CLIENTS, ROWS, TEST_ROWS, BATCH = 25, 160, 40, 128
LABEL_MAPS = (lambda y: y, lambda y: 9 - y, lambda y: (y + 1) % 10)


def datamodule(seed: int) -> FederatedDataModule:
    """25 clients of 160 training and 40 test rows drawn from digits-28, client i under concept i mod 3."""
    x, y = digits_28()
    generator = torch.Generator().manual_seed(seed)
    train, test = [], []
    for client in range(CLIENTS):
        rows = torch.randperm(len(y), generator=generator)[: ROWS + TEST_ROWS]
        xs, ys = x[rows].contiguous(), LABEL_MAPS[client % 3](y[rows])
        train.append((xs[:ROWS], ys[:ROWS]))
        test.append((xs[ROWS:], ys[ROWS:]))
    return FederatedDataModule(train, test, num_classes=10, batch_size=BATCH, seed=seed)


def fit(
    reuse: bool, rounds: int, seed: int, dm: FederatedDataModule, executor: str = "loop", kind: str = "cnn"
) -> tuple[list[float], object]:
    """One fit; its rounds' CPU seconds and the trained module."""
    torch.manual_seed(seed)
    solver = {"lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4}
    model = FashionCNN(10, **solver) if kind == "cnn" else MLPClassifier(784, 10, (200,), **solver)
    strategy = FedRCStrategy(
        3, local_steps=1, seed=seed, executor=executor, optimizer_state="persist", reuse_estep_forward=reuse
    )
    timer = RoundTimer()
    trainer = make_trainer(strategy, rounds, validate=False, callbacks=[timer])
    trainer.fit(model, datamodule=dm)
    return [r["round"] for r in timer.rounds], trainer.lightning_module


def distance(a: object, b: object) -> tuple[float, float]:
    """The largest weight difference relative to the largest weight, and the largest ω difference."""
    weights = zip(a.state_dict().values(), b.state_dict().values(), strict=True)  # type: ignore[attr-defined]
    pairs = [(x.float(), y.float()) for x, y in weights if x.is_floating_point()]
    relative = max(float((x - y).abs().max()) for x, y in pairs) / max(float(x.abs().max()) for x, _ in pairs)
    omega = float((a.client_state.omega - b.client_state.omega).abs().max())  # type: ignore[attr-defined]
    return relative, omega


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per fit; the first is left out")
    parser.add_argument("--pairs", type=int, default=3, help="(off, on) pairs of fits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--executor", choices=("loop", "vectorized"), default="loop")
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    args = parser.parse_args()
    quiet()
    set_clock("cpu")
    dm = datamodule(args.seed)
    print(machine_line())
    print(command_line())
    print(
        f"{CLIENTS} clients x {ROWS} rows, {args.model}, FedRC K=3, one local step of {BATCH} rows, "
        f"persist, {args.executor} executor"
    )
    columns = ("pair", 4), ("off s/round", 12), ("on s/round", 11), ("on/off", 7), ("rel. weight diff", 17)
    print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'ω diff':>9}")
    ratios, offs, ons = [], [], []
    for pair in range(args.pairs):
        off_rounds, off_module = fit(False, args.rounds, args.seed, dm, args.executor, args.model)
        on_rounds, on_module = fit(True, args.rounds, args.seed, dm, args.executor, args.model)
        off, on = statistics.median(off_rounds[1:]), statistics.median(on_rounds[1:])
        relative, omega = distance(off_module, on_module)
        ratios.append(on / off)
        offs.append(off)
        ons.append(on)
        print(f"{pair:>4} {off:>12.3f} {on:>11.3f} {on / off:>7.3f} {relative:>17.2e} {omega:>9.2e}")
    print(
        f"median {statistics.median(offs):>10.3f} {statistics.median(ons):>11.3f} "
        f"{statistics.median(ratios):>7.3f}"
    )
    print(machine_line())


if __name__ == "__main__":
    main()
