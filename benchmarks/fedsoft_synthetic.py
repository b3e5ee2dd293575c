"""The FedSoft paper's synthetic experiment (Ruan & Joe-Wong, AAAI 2022, Table 1, synthetic rows).

Two linear-regression sources y = <x, θ_s> + ε (d = 10, σ0 = 10), 100 clients with 100..200
samples each, mixed by the 10:90, 30:70, linear or random partition. FedSoft with K = 2 centres,
λ = 1, τ = 2, selection size 60, Adam on a bias-free linear model, batch 10, as in the paper's
appendix C, except the local work per round: the paper runs 10 local epochs at lr 5e-3; the
default here is 1 local epoch at lr 0.05 (the same distance a round can move, a tenth of the
steps: Lightning steps cost ~1 ms on this CPU), and 40 rounds instead of 50.
The table gives the test MSE of every centre on each source's hold-out set
(rows θ_s, columns c_k), like the paper's Table 1, plus the personal models' local MSE and the
error of the importance weights against the true mixtures. A centre "specialises" when the two
sources are best served by different centres.

    OMP_NUM_THREADS=1 python benchmarks/fedsoft_synthetic.py --seeds 0
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time
import warnings

import lightning.pytorch as pl
import torch
from _common import make_trainer

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import FedSoftSynthetic
from lightning_fedcluster.models import LinearRegressor

PATTERNS = ("10:90", "30:70", "linear", "random")


def centre_mse(module: lf.ClusteredModule, dm: FedSoftSynthetic) -> torch.Tensor:
    """[S, K]: MSE of centre k on source s's hold-out set."""
    table = torch.zeros(dm.num_global_clients, module.num_clusters, dtype=torch.float64)
    for s in range(dm.num_global_clients):
        x, y = dm.global_split(s)
        _, predictions = module.evaluate_clusters(x)
        table[s] = (predictions.double().squeeze(-1) - y.double()).square().mean(1)
    return table


def run(pattern: str, seed: int, rounds: int, local_epochs: int, lr: float) -> dict[str, float]:
    dm = FedSoftSynthetic(pattern=pattern, seed=seed, batch_size=10)
    strategy = lf.FedSoftStrategy(
        2, proximal=1.0, selection_size=60, estimation_interval=2, local_epochs=local_epochs, seed=seed
    )
    trainer = make_trainer(strategy, rounds, validate=False)
    model = LinearRegressor(10, 1, bias=False, optimizer="adam", lr=lr)
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    seconds = time.perf_counter() - start
    module = trainer.lightning_module
    result = trainer.test(module, datamodule=dm, verbose=False)[0]
    table = centre_mse(module, dm)
    best = table.argmin(1)  # the best centre for each source
    # Importance weights against the true mixtures, with centres matched to sources by `best`.
    u = module.client_state.omega[:, best] if len(set(best.tolist())) == 2 else module.client_state.omega
    mixture_error = float((u - dm.metadata.mixture.double()).abs().sum(1).mean() / 2)
    return {
        "mse": table,
        "specialised": float(len(set(best.tolist())) == 2),
        "local_mse": result["test/local_mse"],
        "mixture_error": mixture_error,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, lightning {pl.__version__}, seeds {args.seeds}, "
        f"rounds {args.rounds}, local epochs {args.local_epochs}"
    )
    print(
        "| pattern | source | best centre MSE | other centre MSE | specialised (seeds) | "
        "personal local MSE | importance error | s / run |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for pattern in args.patterns:
        runs = [run(pattern, seed, args.rounds, args.local_epochs, args.lr) for seed in args.seeds]
        for s in range(2):
            best = [float(r["mse"][s].min()) for r in runs]
            other = [float(r["mse"][s].max()) for r in runs]
            cells = [
                f"{statistics.mean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.2f}"
                for v in (best, other)
            ]
            specialised = int(sum(r["specialised"] for r in runs))
            local = statistics.mean(r["local_mse"] for r in runs)
            error = statistics.mean(r["mixture_error"] for r in runs)
            seconds = statistics.mean(r["seconds"] for r in runs)
            print(
                f"| {pattern} | θ_{s} | {cells[0]} | {cells[1]} | {specialised}/{len(runs)} | "
                f"{local:.2f} | {error:.3f} | {seconds:.1f} |"
            )
        for seed, r in zip(args.seeds, runs, strict=True):
            rows = "; ".join(" ".join(f"{v:.1f}" for v in row.tolist()) for row in r["mse"])
            print(f"  {pattern} seed {seed}: MSE rows θ_s, columns c_k: {rows}", flush=True)


if __name__ == "__main__":
    main()
