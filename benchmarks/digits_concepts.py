"""FedRC (K=3) against FedAvg (FedRC with K=1) on the main job's scenario, over several seeds.

DigitsFederated: 30 clients, three concepts (identity, 9−y, (y+1) mod 10), Dirichlet(1.0)
label shift, the FedRC paper's client-type mix with corrupted clients; 10 clients per round,
5 local steps of batch 32, SGD lr 0.2, 150 rounds. Prints a table (mean ± std and per seed)
and the machine; results are recorded in benchmarks/RESULTS.md.

    python benchmarks/digits_concepts.py --seeds 0 1 2 3 4 5
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

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier

METRICS = ("test/local_acc", "test/global_acc", "test/concept_ari")


def run(num_clusters: int, seed: int, rounds: int) -> dict[str, float]:
    dm = DigitsFederated(num_clients=30, concepts=3, seed=seed)
    strategy = FedRCStrategy(num_clusters, clients_per_round=10, local_steps=5, seed=seed)
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=rounds, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
    seconds = time.perf_counter() - start
    result = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    return {**{m: result[m] for m in METRICS}, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    rows = {k: [run(k, seed, args.rounds) for seed in args.seeds] for k in (3, 1)}
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, lightning {pl.__version__}, seeds {args.seeds}")
    print(f"{'model':<16}{'local acc':>16}{'global acc':>16}{'concept ARI':>16}{'s / run':>10}")
    for k, runs in rows.items():
        cells = []
        for metric in METRICS:
            values = [r[metric] for r in runs]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}")
        name = "FedRC K=3" if k == 3 else "FedAvg (K=1)"
        print(f"{name:<16}" + "".join(f"{c:>16}" for c in cells)
              + f"{statistics.mean(r['seconds'] for r in runs):>10.1f}")
    print("per seed (global acc / ARI):")
    for k, runs in rows.items():
        print(f"  K={k}: " + ", ".join(f"s{s}: {r['test/global_acc']:.3f}/{r['test/concept_ari']:.2f}"
                                      for s, r in zip(args.seeds, runs, strict=True)))


if __name__ == "__main__":
    main()
