"""The quick start's wall time at each intra-op thread setting, with 0, 1 and 2 busy background
processes (each a Python loop spinning on one core).

Each run is the quick start's command, ``fedcluster fit`` with its defaults, in a fresh process
(start-up included, as a user waits for it) with ``--rounds`` rounds (default 50 of its 150, to
keep the measurement short; the recorded table used 30; validation every 25 rounds, figures off).
Settings: "engine" (the strategy's ``num_threads`` left unset: the engine's choice, one thread
for this model), and ``num_threads`` 1, 2, ... up to the cores (2 was the default before the
engine chose: torch's count on 2 cores). ``OMP_NUM_THREADS`` is unset in every run. The busy
processes start before and stop after each load's runs; the settings are interleaved within a
load. The table gives each run's seconds, its ratio to the best setting at that load, and the
1-minute load average at its start; the machine line is printed first.

    python benchmarks/threads.py --rounds 50
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import command_line, machine_line

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def run_quick_start(rounds: int, threads: int | None, workdir: Path) -> float:
    """Seconds of one quick-start run (``threads`` None: the engine's choice)."""
    command = [
        sys.executable, "-m", "lightning_fedcluster.cli", "fit", f"--trainer.max_epochs={rounds}",
        "--trainer.check_val_every_n_epoch=25", "--figures=false",
    ]  # fmt: skip
    if threads is not None:
        command.append(f"--trainer.strategy.init_args.num_threads={threads}")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2], help="busy background processes")
    parser.add_argument("--workdir", default="/tmp/fedcluster-threads")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    settings: list[int | None] = [None, *range(1, cores + 1)]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(command_line())
    print(machine_line())
    print(f"quick start, {args.rounds} rounds; {cores} cores in this process's affinity")
    print(f"{'busy':>4}  {'threads':>8}  {'seconds':>8}  {'x best':>7}  {'load':>5}")
    for load in args.loads:
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(load)]
        try:
            rows = []
            for threads in settings:
                before = os.getloadavg()[0]
                rows.append((threads, run_quick_start(args.rounds, threads, workdir), before))
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
        best = min(seconds for _, seconds, _ in rows)
        for threads, seconds, before in rows:
            name = "engine" if threads is None else str(threads)
            ratio = seconds / best
            print(f"{load:>4}  {name:>8}  {seconds:>8.1f}  {ratio:>7.2f}  {before:>5.1f}", flush=True)


if __name__ == "__main__":
    main()
