"""W4: rounds per second of W1 with 1 process against 2 processes (gloo, CPU).

W1's workload (30 clients × 180 samples, FashionCNN, K = 3 FedRC, batch 128, one local epoch,
evaluation every round) with one torch thread per process (OMP_NUM_THREADS=1), run as
``devices=1`` and ``devices=2`` in fresh processes (Lightning's subprocess launcher starts the
second rank). Reports the wall-clock rounds/s ratio (target >= 1.7), an estimate from CPU
seconds (1-process CPU per round over the busier rank's CPU per round: what the ratio would be
on an otherwise idle machine, communication waits aside) and whether the final weights and
client state of the two runs are identical.

    python benchmarks/w4_scaling.py --rounds 3 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DISTRIBUTED_VARIABLES = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
                         "LOCAL_WORLD_SIZE", "GROUP_RANK"}


def worker(devices: int, rounds: int, out: Path) -> None:
    """Train W1 on ``devices`` processes; every rank writes its per-round wall and CPU seconds."""
    import lightning.pytorch as pl
    import torch
    from _common import make_trainer, quiet, w1_datamodule

    from lightning_fedcluster import FedRCStrategy
    from lightning_fedcluster.models import FashionCNN

    class Clocks(pl.Callback):
        def __init__(self) -> None:
            self.rows: list[dict[str, float]] = []

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._wall, self._cpu = time.perf_counter(), time.process_time()
            self._phases = dict(pl_module.phase_seconds)

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            row = {"wall": time.perf_counter() - self._wall, "cpu": time.process_time() - self._cpu}
            row.update({p: v - self._phases[p] for p, v in pl_module.phase_seconds.items()})
            self.rows.append(row)

    quiet()
    torch.set_num_threads(1)
    clocks = Clocks()
    strategy = FedRCStrategy(3, local_epochs=1, seed=0)
    trainer = make_trainer(strategy, rounds, validate=True, callbacks=[clocks], devices=devices)
    trainer.fit(FashionCNN(lr=0.01), datamodule=w1_datamodule())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(clocks.rows))
    if trainer.is_global_zero:
        module = trainer.lightning_module
        torch.save({"weights": module.state_dict(), "client_state": module.client_state.state_dict()},
                   out / "result.pt")


GEMM_PROBE = (
    "import time, torch; torch.set_num_threads(1); a = torch.randn(512, 512)\n"
    "n, t = 0, time.perf_counter()\n"
    "while time.perf_counter() - t < 3: a @ a; n += 1\n"
    "print(n / (time.perf_counter() - t))"
)


def parallel_capacity() -> float:
    """Matmul throughput of two concurrent one-thread processes over that of one: what this
    machine can give a second process right now (2.0 on an idle 2-core machine)."""

    def run(copies: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", GEMM_PROBE], stdout=subprocess.PIPE, text=True)
                 for _ in range(copies)]
        return sum(float(p.communicate()[0]) for p in procs)

    return run(2) / run(1)


def launch(devices: int, rounds: int, out: Path) -> float:
    """Run a worker in a fresh process (1 torch thread per rank); returns its wall seconds."""
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    root = Path(__file__).resolve().parent.parent
    env = {**inherited, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), inherited.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--devices", str(devices), "--rounds",
         str(rounds), "--out", str(out)],
        cwd=Path(__file__).resolve().parent, env=env, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"devices={devices} failed:\n{done.stderr[-4000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    total = args.warmup + args.rounds
    if args.worker:
        worker(args.devices, total, Path(args.out))
        return
    import torch
    from _common import command_line, machine_line

    capacity_before = parallel_capacity()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for devices in (1, 2):
            out = Path(tmp) / f"devices{devices}"
            seconds = launch(devices, total, out)
            ranks = [json.loads((out / f"rank{r}.json").read_text())[args.warmup:] for r in range(devices)]
            wall = statistics.median(max(rank[i]["wall"] for rank in ranks) for i in range(args.rounds))
            cpu = statistics.median(max(rank[i]["cpu"] for rank in ranks) for i in range(args.rounds))
            phases = {p: statistics.median(max(rank[i][p] for rank in ranks) for i in range(args.rounds))
                      for p in ("e_step", "local_training", "aggregation", "evaluation")}
            results[devices] = (wall, cpu, phases, seconds, torch.load(out / "result.pt"))
        one, two = results[1][4], results[2][4]
        same = all(torch.equal(v, two["weights"][k]) for k, v in one["weights"].items()) and all(
            torch.equal(v, two["client_state"][k]) for k, v in one["client_state"].items())
        print(machine_line())
        print(f"command: {command_line()}")
        print(f"parallel capacity (2 one-thread matmul processes / 1): {capacity_before:.2f} before, "
              f"{parallel_capacity():.2f} after the runs (2.00 = two free cores)")
        print(f"W4: W1 workload, 1 torch thread per process; median of {args.rounds} rounds after "
              f"{args.warmup} warm-up (slowest rank per round)")
        print(f"{'':<12}{'wall s/rnd':>11}{'rounds/s':>10}{'CPU s/rnd':>11}{'e_step':>8}{'train':>8}"
              f"{'aggr':>8}{'eval':>8}{'process s':>11}")
        for devices, (wall, cpu, phases, seconds, _) in results.items():
            print(f"{f'devices={devices}':<12}{wall:>11.2f}{1 / wall:>10.3f}{cpu:>11.2f}"
                  + "".join(f"{v:>8.2f}" for v in phases.values()) + f"{seconds:>11.1f}")
        print(f"speed-up devices=2 / devices=1: wall {results[1][0] / results[2][0]:.2f}x (target >= 1.7), "
              f"CPU-time estimate {results[1][1] / results[2][1]:.2f}x; weights and client state identical: "
              f"{same}")


if __name__ == "__main__":
    main()
