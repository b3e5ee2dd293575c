"""W3: peak resident memory against the number of clients, each setting in a fresh process.

FashionCNN, K = 3 FedRC, one local epoch of batch 128, one round plus one evaluation of every
client's local test split. Each client holds N samples of random [1, 28, 28] inputs, split
80/20 into train/test. Settings: 300 clients × 200 samples (all clients in the round), and
1,000 / 3,000 / 10,000 clients × 50 samples (300 clients per round: memory must not depend on
the client count beyond the data and small per-client state; ``--full`` trains all of them).
Workers run with one torch thread (memory does not depend on it; tiny batches run faster).

Reported per setting: the data's size, the RSS after the datamodule is built, the peak RSS of
the whole process (ru_maxrss: includes building the datamodule, whose constructor concatenates
the clients' tensors and so briefly holds the data twice) and the peak during fit alone
(VmHWM after resetting it through /proc/self/clear_refs).

    python benchmarks/w3_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS = [(300, 200, None), (1000, 50, 300), (3000, 50, 300), (10000, 50, 300)]
TARGETS_MB = {(300, 200): 2048, (10000, 50): 4096}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def w3_clients(clients: int, samples: int, generator: Any) -> tuple[list, list]:
    """W3's clients: random [1, 28, 28] inputs and labels drawn from ``generator``, each client's
    first 80 % training rows and the rest held out, all views of one tensor (as a user slicing
    one dataset passes them)."""
    import torch

    train_n = samples - samples // 5
    x = torch.rand(clients * samples, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (clients * samples,), generator=generator)
    rows = [(i * samples, i * samples + train_n, (i + 1) * samples) for i in range(clients)]
    return [(x[a:b], y[a:b]) for a, b, _ in rows], [(x[b:c], y[b:c]) for _, b, c in rows]


def worker(clients: int, samples: int, per_round: int | None) -> dict[str, float]:
    """Build the data and train one round in this process; return memory figures in MB."""
    import torch
    from _common import current_rss_mb, make_trainer, peak_rss_mb, quiet

    from lightning_fedcluster import FederatedDataModule, FedRCStrategy
    from lightning_fedcluster.models import FashionCNN

    quiet()
    baseline = current_rss_mb()
    generator = torch.Generator().manual_seed(0)
    train, test = w3_clients(clients, samples, generator)
    dm = FederatedDataModule(train, test, num_classes=10, batch_size=128)
    del train, test
    tensors = (dm.train_x, dm.train_y, dm.test_x, dm.test_y)
    data_mb = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    after_data = current_rss_mb()
    build_peak = peak_rss_mb()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    strategy = FedRCStrategy(3, local_epochs=1, clients_per_round=per_round, seed=0)
    trainer = make_trainer(strategy, 1, validate=True)
    start = time.perf_counter()
    trainer.fit(FashionCNN(lr=0.01), datamodule=dm)
    module = trainer.lightning_module
    state_mb = sum(t.numel() * t.element_size() for t in module.client_state.state_dict().values()) / 2**20
    return {
        "baseline_mb": baseline, "data_mb": data_mb, "after_data_mb": after_data, "build_peak_mb": build_peak,
        # clear_refs also resets ru_maxrss, so the whole-process peak is the larger of the two.
        "fit_peak_mb": _status_kb("VmHWM") / 1024, "peak_mb": max(build_peak, peak_rss_mb()),
        "client_state_mb": state_mb,
        "fit_seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=3, metavar=("M", "N", "PER_ROUND"), help=argparse.SUPPRESS)
    parser.add_argument("--full", action="store_true", help="train every client in the round (slow)")
    parser.add_argument("--settings", nargs="+", help="CLIENTSxSAMPLES, e.g. 300x200 10000x50")
    args = parser.parse_args()
    if args.worker:
        clients, samples, per_round = (int(v) for v in args.worker)
        print(json.dumps(worker(clients, samples, per_round or None)))
        return
    from _common import command_line, machine_line

    settings = SETTINGS
    if args.settings:
        settings = [(int(a), int(b), None if int(a) <= 300 else 300)
                    for a, b in (s.split("x") for s in args.settings)]
    if args.full:
        settings = [(m, n, None) for m, n, _ in settings]
    here = Path(__file__).resolve().parent
    results = []
    for clients, samples, per_round in settings:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(clients), str(samples),
             str(per_round or 0)],
            cwd=here, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if done.returncode != 0:
            raise SystemExit(f"worker {clients}x{samples} failed:\n{done.stderr[-3000:]}")
        results.append((clients, samples, per_round, json.loads(done.stdout.strip().splitlines()[-1])))
        print(f"done {clients} x {samples}: {results[-1][-1]}", file=sys.stderr, flush=True)
    print(machine_line())
    print(f"command: {command_line()}")
    print("W3: FashionCNN, K=3 FedRC, 1 round + 1 evaluation, random [1,28,28] inputs, 80/20 split; MB")
    print(f"{'clients x samples':<20}{'per round':>10}{'data':>9}{'after dm':>10}{'peak':>9}{'fit peak':>10}"
          f"{'fit-data':>10}{'state':>8}{'target':>8}{'fit s':>8}")
    for clients, samples, per_round, r in results:
        target = TARGETS_MB.get((clients, samples))
        print(f"{f'{clients} x {samples}':<20}{per_round or clients:>10}{r['data_mb']:>9.0f}"
              f"{r['after_data_mb']:>10.0f}{r['peak_mb']:>9.0f}{r['fit_peak_mb']:>10.0f}"
              f"{r['fit_peak_mb'] - r['data_mb']:>10.0f}{r['client_state_mb']:>8.2f}"
              f"{(str(target) if target else '-'):>8}{r['fit_seconds']:>8.1f}")
    small = [(m, r) for m, n, _, r in results if n == 50]
    if len(small) >= 2:
        (m0, r0), (m1, r1) = small[0], small[-1]
        slope = (r1["fit_peak_mb"] - r0["fit_peak_mb"]) / (m1 - m0) * 1024
        data_slope = (r1["data_mb"] - r0["data_mb"]) / (m1 - m0) * 1024
        print(f"slope of the fit peak from {m0} to {m1} clients (50 samples each): {slope:.1f} KB per "
              f"client, of which data {data_slope:.1f} KB (the authors' FedRC code: ~100 MB per client)")


if __name__ == "__main__":
    main()
