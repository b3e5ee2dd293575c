"""Memory probe (W3 follow-up): where the peak resident memory of W3's 300 x 200 setting goes.

Runs each measurement in a fresh process of the interpreter that runs this script (run it once
with each torch build to compare them) and prints one table, in MB:

* import: RSS after importing torch, then Lightning, then lightning_fedcluster.
* forward B: one no-grad forward of one FashionCNN over a batch of B random [1, 28, 28] inputs:
  the peak above the RSS before it (the transient activations), and what stays resident after it.
* fit: W3's first setting (300 clients x 200 samples of random [1, 28, 28] inputs, 80/20 split,
  FashionCNN, K = 3 FedRC, one local epoch of batch 128, every client in every round) for
  ``--rounds`` rounds with validation every round; the peak (VmHWM, reset through
  /proc/self/clear_refs at every boundary) of each phase: building the data, each round's
  training, each round's validation; the RSS at the end and after glibc's malloc_trim(0) (what
  the allocator keeps cached but free).
* validate E: the same data plus ``--global-clients`` global test clients of ``--global-size``
  samples each (FashionMNIST's hold-out is ~4,700 samples per concept), one trainer.validate
  (untrained models: memory does not depend on the weights) with ClusteredModule(eval_batch_size=E).

    OMP_NUM_THREADS=1 python benchmarks/memory_probe.py
    OMP_NUM_THREADS=1 /path/to/other/venv/bin/python benchmarks/memory_probe.py
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

from w3_memory import _status_kb

FORWARD_BATCHES = (160, 256, 1024, 4096)
EVAL_BATCHES = (4096, 1024, 256)


def _mb(field: str) -> float:
    return _status_kb(field) / 1024


def _reset_peak() -> None:
    """Reset VmHWM (and ru_maxrss) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim() -> float:
    """Hand glibc's free heap memory back to the system; returns the RSS afterwards."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return _mb("VmRSS")


def import_worker() -> dict[str, float]:
    row = {"interpreter": _mb("VmRSS")}
    import torch  # noqa: F401

    row["torch"] = _mb("VmRSS")
    import lightning.pytorch  # noqa: F401

    row["lightning"] = _mb("VmRSS")
    import lightning_fedcluster  # noqa: F401
    import lightning_fedcluster.models  # noqa: F401

    row["fedcluster"] = _mb("VmRSS")
    return row


def forward_worker() -> dict[str, float]:
    import torch

    from lightning_fedcluster.models import FashionCNN

    model = FashionCNN().eval()
    with torch.no_grad():
        model(torch.rand(2, 1, 28, 28))
    row: dict[str, float] = {}
    for batch in FORWARD_BATCHES:
        x = torch.rand(batch, 1, 28, 28)
        before = _mb("VmRSS")
        _reset_peak()
        with torch.no_grad():
            out = model(x)
        row[f"peak+ {batch}"] = _mb("VmHWM") - before
        del out, x
        row[f"kept {batch}"] = _mb("VmRSS") - before
    return row


def _w3_data(clients: int, samples: int, global_clients: int, global_size: int):  # noqa: ANN202
    """W3's data (same generator and split) plus optional global test clients."""
    import torch
    from w3_memory import w3_clients

    from lightning_fedcluster import FederatedDataModule

    generator = torch.Generator().manual_seed(0)
    train, test = w3_clients(clients, samples, generator)
    held = [(torch.rand(global_size, 1, 28, 28, generator=generator),
             torch.randint(0, 10, (global_size,), generator=generator)) for _ in range(global_clients)]
    return FederatedDataModule(train, test, held, num_classes=10, batch_size=128)


def run_worker(mode: str, rounds: int, eval_batch: int, clients: int, samples: int, global_clients: int,
               global_size: int) -> dict[str, float]:
    """``fit``: W3's setting for ``rounds`` rounds with validation every round; ``validate``: one
    trainer.validate. Peak RSS of every phase (VmHWM reset at each phase boundary)."""
    import lightning.pytorch as pl
    from _common import make_trainer, quiet
    from lightning.pytorch.trainer.states import TrainerFn

    from lightning_fedcluster import ClusteredModule, FedRCStrategy
    from lightning_fedcluster.models import FashionCNN

    quiet()
    row = {"import": _mb("VmRSS")}
    _reset_peak()
    dm = _w3_data(clients, samples, global_clients, global_size)
    row["data peak"] = _mb("VmHWM")
    row["after data"] = _mb("VmRSS")

    class PhasePeaks(pl.Callback):
        def _take(self, name: str) -> None:
            row[name] = _mb("VmHWM")
            _reset_peak()

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if trainer.current_epoch == 0:
                self._take("setup")  # the trainer's and module's setup before the first round
            else:
                _reset_peak()

        def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._take(f"train {trainer.current_epoch + 1}" if fitting(trainer) else "setup")

        def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._take(f"val {trainer.current_epoch + 1}" if fitting(trainer) else "val")

    def fitting(trainer: pl.Trainer) -> bool:
        return trainer.state.fn == TrainerFn.FITTING

    module = ClusteredModule(FashionCNN(lr=0.01), 3, seed=0, eval_batch_size=eval_batch)
    strategy = FedRCStrategy(3, local_epochs=1, seed=0)
    _reset_peak()
    if mode == "fit":
        trainer = make_trainer(strategy, rounds, validate=True, callbacks=[PhasePeaks()])
        trainer.fit(module, datamodule=dm)
    else:
        trainer = make_trainer(strategy, 1, validate=True, callbacks=[PhasePeaks()])
        trainer.validate(module, datamodule=dm, verbose=False)
    row["end"] = _mb("VmRSS")
    row["after trim"] = _trim()
    phases = [v for k, v in row.items() if k.startswith(("setup", "train ", "val"))]
    row["peak"] = max([row["data peak"], *phases])
    return row


def spawn(threads: int, *arguments: str) -> dict[str, float]:
    here = Path(__file__).resolve().parent
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else {
        k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", *arguments], cwd=here,
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"worker {arguments} failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"done {' '.join(arguments)}: {json.dumps({k: round(v) for k, v in row.items()})}", file=sys.stderr,
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the fit (validation every round)")
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--samples", type=int, default=200, help="samples per client (80/20 train/test)")
    parser.add_argument("--global-clients", type=int, default=3, help="global clients (validate runs)")
    parser.add_argument("--global-size", type=int, default=4700, help="samples per global test client")
    parser.add_argument("--fit-eval-batch", type=int, nargs="*", default=[4096],
                        help="eval_batch_size of the fit runs (none: skip the fit)")
    parser.add_argument("--eval-batch", type=int, nargs="*", default=list(EVAL_BATCHES),
                        help="eval_batch_size of the validate runs")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS of the workers (0: unset, torch's default of one per core)")
    args = parser.parse_args()
    if args.worker:
        mode, *rest = args.worker
        if mode == "import":
            row = import_worker()
        elif mode == "forward":
            row = forward_worker()
        else:
            row = run_worker(mode, *(int(v) for v in rest))
        print(json.dumps(row))
        return
    from _common import command_line, machine_line

    size = (str(args.clients), str(args.samples))
    imports = spawn(args.threads, "import")
    forward = spawn(args.threads, "forward")
    fits = {b: spawn(args.threads, "fit", str(args.rounds), str(b), *size, "0", "0")
            for b in args.fit_eval_batch}
    validates = {b: spawn(args.threads, "validate", "1", str(b), *size, str(args.global_clients),
                          str(args.global_size)) for b in args.eval_batch}

    print(machine_line())
    print(f"command: {command_line()}")
    threads = args.threads or f"unset ({os.cpu_count()} cores)"
    print(f"memory probe, MB, workers with OMP_NUM_THREADS={threads}; RSS after import: interpreter "
          f"{imports['interpreter']:.0f}, +torch "
          f"{imports['torch']:.0f}, +Lightning {imports['lightning']:.0f}, +lightning_fedcluster "
          f"{imports['fedcluster']:.0f}")
    print("one no-grad FashionCNN forward, peak above the RSS before it / kept after it: " + ", ".join(
        f"B={b}: +{forward[f'peak+ {b}']:.0f} / {forward[f'kept {b}']:+.0f}" for b in FORWARD_BATCHES))
    for name, runs, what in (
        ("fit", fits, f"{args.clients} x {args.samples}, {args.rounds} rounds, validation every round"),
        ("validate", validates, f"{args.clients} x {args.samples} + {args.global_clients} global clients x "
                                f"{args.global_size}, one trainer.validate"),
    ):
        if not runs:
            continue
        columns = [k for k in next(iter(runs.values())) if k != "import"]
        print(f"{name}: {what}; peak RSS of each phase, RSS at the end and after malloc_trim(0)")
        print(f"{'eval_batch_size':<16}" + "".join(f"{c:>11}" for c in columns))
        for batch, row in runs.items():
            print(f"{batch:<16}" + "".join(f"{row[c]:>11.0f}" for c in columns))


if __name__ == "__main__":
    main()
