"""Whole-process peak RSS of the 300-client memory scenario, measured from outside with /usr/bin/time -v.

300 clients x 200 samples of FashionMNIST-sized inputs ([1, 28, 28], 10 classes), FashionCNN, K = 3
FedRC, one local epoch of batch 128, every client in every round, 2 rounds, no validation. Each
setting runs in a fresh child process of the interpreter that runs this script (run it once with
each torch build) under ``/usr/bin/time -v``; its "Maximum resident set size" is the figure. The
child also prints its RSS and peak (VmRSS, VmHWM) at each phase: imports, data, fit start, the end
of every round.

Data (``--data``):
* ``tensors``: W3's clients (random [1, 28, 28] inputs, 160 train / 40 held-out rows each, no
  global clients) passed to ``FederatedDataModule`` as per-client views of one tensor.
* ``scenario``: the FashionMNISTFederated path without torchvision: a 60,000 + 10,000 image
  FashionMNIST-sized set (random pixels quantised to /255, uniform labels) given to
  ``FederatedDataModule.from_tensors`` (300 clients, 3 concepts, Dirichlet 1.0 label skew, the
  FashionMNIST-C corruptions, the 10,000 test images as the 3 global clients).

Trainer (``--trainer``): ``default`` (a plain ``Trainer(...)``: TensorBoard logger, checkpoint,
progress bar) or ``quiet`` (none of them, as the other benchmarks). Also printed: the child's CPU
seconds (user + system), a rough cost figure only (the machine is shared).

    OMP_NUM_THREADS=1 python benchmarks/memory_rss.py --data scenario
    OMP_NUM_THREADS=1 /path/to/cpu-only-venv/bin/python benchmarks/memory_rss.py --data scenario
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from w3_memory import _status_kb

TARGET_MB = 2048


def _status_mb(field: str) -> float:
    return _status_kb(field) / 1024


def _mark(name: str) -> None:
    """One phase line on stderr: current RSS and the peak so far, MB."""
    print(f"phase {name} {_status_mb('VmRSS'):.0f} {_status_mb('VmHWM'):.0f}", file=sys.stderr, flush=True)


def _tensors_data(clients: int, samples: int):  # noqa: ANN202
    import torch
    from w3_memory import w3_clients

    from lightning_fedcluster import FederatedDataModule

    generator = torch.Generator().manual_seed(0)
    train, test = w3_clients(clients, samples, generator)
    return FederatedDataModule(train, test, num_classes=10, batch_size=128)


def _scenario_data(clients: int, samples: int):  # noqa: ANN202
    import torch

    from lightning_fedcluster import FederatedDataModule
    from lightning_fedcluster.datamodules.shifts import FASHION_MNIST_C

    generator = torch.Generator().manual_seed(0)

    def images(n: int):  # noqa: ANN202
        pixels = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=generator)
        return pixels.to(torch.float32) / 255.0, torch.randint(0, 10, (n,), generator=generator)

    x, y = images(clients * samples)
    test = images(10_000)
    return FederatedDataModule.from_tensors(
        x,
        y,
        num_clients=clients,
        concepts=3,
        dirichlet_alpha=1.0,
        global_test=test,
        corruptions=FASHION_MNIST_C,
        num_classes=10,
        batch_size=128,
        seed=0,
    )


def worker(
    data: str, trainer_kind: str, clients: int, samples: int, rounds: int, per_round: int | None, log_dir: str
) -> None:
    """Build the data and fit ``rounds`` rounds in this process, printing phase lines."""
    _mark("start")
    import torch  # noqa: F401

    _mark("import-torch")
    import lightning.pytorch as pl

    _mark("import-lightning")
    from lightning_fedcluster import FedRCStrategy
    from lightning_fedcluster.models import FashionCNN

    _mark("import-library")
    dm = (_tensors_data if data == "tensors" else _scenario_data)(clients, samples)
    _mark("data")

    class Phases(pl.Callback):
        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            _mark("fit-start")

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            _mark(f"round-{trainer.current_epoch + 1}")

    options: dict = dict(
        strategy=FedRCStrategy(3, local_epochs=1, clients_per_round=per_round, seed=0),
        accelerator="cpu",
        devices=1,
        max_epochs=rounds,
        limit_val_batches=0,
        callbacks=[Phases()],
        default_root_dir=log_dir,
    )
    if trainer_kind == "quiet":
        options.update(
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
        )
    pl.Trainer(**options).fit(FashionCNN(lr=0.01), datamodule=dm)
    _mark("end")


def measure(
    data: str, trainer_kind: str, clients: int, samples: int, rounds: int, per_round: int | None
) -> dict[str, float]:
    """Run one worker under /usr/bin/time -v; its phases and the Maximum resident set size (MB)."""
    with tempfile.TemporaryDirectory() as log_dir:
        command = [
            "/usr/bin/time",
            "-v",
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            data,
            trainer_kind,
            str(clients),
            str(samples),
            str(rounds),
            str(per_round or 0),
            log_dir,
        ]
        done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent)
    if done.returncode != 0:
        raise SystemExit(f"worker {data} {trainer_kind} failed:\n{done.stderr[-3000:]}")
    row: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if line.startswith("phase "):
            _, name, rss, _peak = line.split()
            row[name] = float(rss)
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    row["max_rss"] = int(found.group(1)) / 1024 if found else float("nan")
    seconds = re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr)
    row["cpu_s"] = sum(float(v) for v in seconds) if seconds else float("nan")
    print(f"done {data} {trainer_kind}: {row}", file=sys.stderr, flush=True)
    return row


def machine() -> str:
    import lightning
    import torch

    memory = ""
    try:
        with open("/proc/meminfo") as f:
            memory = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {memory}, load {os.getloadavg()[0]:.1f}; "
        f"python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    parser.add_argument("--data", nargs="+", default=["scenario", "tensors"], choices=["tensors", "scenario"])
    parser.add_argument("--trainer", nargs="+", default=["default"], choices=["quiet", "default"])
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients-per-round", type=int, help="default: every client (exploration only)")
    args = parser.parse_args()
    if args.worker:
        data, trainer_kind, clients, samples, rounds, per_round, log_dir = args.worker
        worker(data, trainer_kind, int(clients), int(samples), int(rounds), int(per_round) or None, log_dir)
        return
    rows = [
        (d, t, measure(d, t, args.clients, args.samples, args.rounds, args.clients_per_round))
        for d in args.data
        for t in args.trainer
    ]
    print(f"machine: {machine()}")
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"{args.clients} clients x {args.samples} samples [1, 28, 28], FashionCNN, K = 3 FedRC, "
        f"{args.rounds} rounds, no validation; RSS in MB after each phase; peak = /usr/bin/time -v"
    )
    phases = ["import-torch", "import-lightning", "import-library", "data", "fit-start"]
    phases += [f"round-{r + 1}" for r in range(args.rounds)]
    print(
        f"{'data':<10}{'trainer':<9}"
        + "".join(f"{p:>17}" for p in phases)
        + f"{'peak':>8}{'target':>8}{'cpu s':>8}"
    )
    for data, trainer_kind, row in rows:
        cells = "".join(f"{row.get(p, float('nan')):>17.0f}" for p in phases)
        print(f"{data:<10}{trainer_kind:<9}{cells}{row['max_rss']:>8.0f}{TARGET_MB:>8}{row['cpu_s']:>8.0f}")


if __name__ == "__main__":
    main()
