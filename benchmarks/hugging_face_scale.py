"""Setup time and peak memory of a large natural-id data set: from a parquet file through
``FederatedDataModule.from_hugging_face`` (a Flower Datasets ``NaturalIdPartitioner``) against the
same set given as tensors (``FederatedDataModule.from_tensors`` with the same natural clients).

The set is generated and written to parquet first: ``--rows`` rows of ``--features`` float32
features in [0, 1], a label of 10 classes and a ``writer`` id of ``--clients`` natural clients
(uniform). Every variant runs in a fresh child process and builds the same scenario (0.2 of every
class held out for one global client, the pool split by writer, 0.2 of each client's rows held
out), then trains ``--rounds`` FedAvg rounds of 10 clients with the loop executor:

* ``tensors``: the parquet file read with pyarrow into one tensor, clients by ``partition.natural_split``;
* ``hf cold``: ``from_hugging_face(path)``, the Arrow cache built from the parquet file first;
* ``hf warm``: the same, the Arrow cache already there;
* ``hf mmap``: warm, with ``memory_map=DIR``: the training inputs in a memory-mapped file.

Columns: seconds to build the datamodule (wall, from the first read of the file), of which in the
Flower Datasets partitioner (giving it the pool's id and label columns, its partitioning, reading
back each partition's row ids; the ``hf`` variants), the child's peak
RSS (VmHWM, MiB, file-backed pages of memory-mapped files included), its peak anonymous memory
(RssAnon sampled every 10 ms, MiB: memory that cannot be paged back to a file), and a checksum of
the clients' training rows, equal across variants when they built the same clients.

    OMP_NUM_THREADS=1 python benchmarks/hugging_face_scale.py --rows 1000000 --clients 1000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

VARIANTS = ("tensors", "hf cold", "hf warm", "hf mmap")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class AnonPeak:
    """The largest RssAnon seen by a sampling thread."""

    def __init__(self) -> None:
        self.peak = _status_mb("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _status_mb("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status_mb("RssAnon"))


def generate(path: Path, rows: int, features: int, clients: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    columns = {f"f{j}": rng.random(rows, dtype=np.float32) for j in range(features)}
    columns["label"] = rng.integers(0, 10, rows)
    columns["writer"] = rng.integers(0, clients, rows)
    pq.write_table(pa.table(columns), path)


def child(variant: str, path: Path, work: Path, features: int, rounds: int) -> dict:
    import numpy as np
    import torch

    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import FederatedDataModule, partition
    from lightning_fedcluster.models import MLPClassifier

    names = [f"f{j}" for j in range(features)]
    options = dict(test_fraction=0.2, global_test_fraction=0.2, corrupt_fraction=0.0, batch_size=32, seed=0)
    spent = {"partitioner_s": float("nan")}
    anon = AnonPeak()
    start = time.perf_counter()
    if variant == "tensors":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        x = torch.from_numpy(np.stack([table[n].to_numpy() for n in names], axis=1))
        y = torch.from_numpy(table["label"].to_numpy())
        writers = table["writer"].to_numpy()
        del table

        def by_writer(pool: np.ndarray) -> list[np.ndarray]:
            return [pool[part] for part in partition.natural_split(writers[pool])]

        dm = FederatedDataModule.from_tensors(x, y, partition=by_writer, **options)
        del x, y
    else:
        from flwr_datasets.partitioner import NaturalIdPartitioner

        from lightning_fedcluster.datamodules.hugging_face import PartitionerRows

        partitioning = PartitionerRows.__call__

        def timed(self, pool):  # noqa: ANN001, ANN202  the partitioner's share of the setup
            began = time.perf_counter()
            try:
                return partitioning(self, pool)
            finally:
                spent["partitioner_s"] = time.perf_counter() - began

        PartitionerRows.__call__ = timed

        cache = work / "hf-cache"
        if variant == "hf cold":
            shutil.rmtree(cache, ignore_errors=True)
        mapped = work / "mmap" if variant == "hf mmap" else None
        dm = FederatedDataModule.from_hugging_face(
            path, features=names, label="label", partitioner=NaturalIdPartitioner("writer"),
            cache_dir=str(cache), memory_map=mapped, **options,
        )  # fmt: skip
    setup = time.perf_counter() - start
    checksum = float(dm.train_x.double().sum()) + float(dm.train_y.sum())
    strategy = lf.FedAvgStrategy(clients_per_round=10, local_steps=1, executor="loop", seed=0)
    trainer = lf_trainer(strategy, rounds)
    trainer.fit(MLPClassifier(in_features=features, hidden=(32,)), datamodule=dm)
    return {
        "setup_s": setup, "clients": dm.num_clients, "peak_mb": _status_mb("VmHWM"),
        "anon_peak_mb": anon.stop(), "checksum": checksum, **spent,
    }  # fmt: skip


def lf_trainer(strategy, rounds: int):  # noqa: ANN201
    import lightning.pytorch as pl

    return pl.Trainer(
        strategy=strategy, accelerator="cpu", devices=1, max_epochs=rounds, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="FedAvg rounds trained after setup")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        work = Path(args.work)
        print(json.dumps(child(args.child, work / "set.parquet", work, args.features, args.rounds)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import command_line, machine_line

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        started = time.perf_counter()
        generate(work / "set.parquet", args.rows, args.features, args.clients)
        size = (work / "set.parquet").stat().st_size / 2**20
        print(f"{command_line()}\n{machine_line()}")
        print(
            f"set: {args.rows:,} rows x {args.features} float32 features, {args.clients:,} writers, "
            f"parquet {size:.0f} MiB, generated in {time.perf_counter() - started:.1f} s"
        )
        heading = (
            ("clients", 9),
            ("setup s", 10),
            ("partitioner s", 15),
            ("peak RSS MiB", 14),
            ("peak anon MiB", 15),
        )
        print(f"{'variant':<10}" + "".join(f"{name:>{width}}" for name, width in heading) + "  checksum")
        for variant in args.variants:
            command = [sys.executable, __file__, "--child", variant, "--work", str(work),
                       "--features", str(args.features), "--rounds", str(args.rounds)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
            if done.returncode:
                print(f"{variant}: failed\n{done.stderr[-3000:]}")
                continue
            row = json.loads(done.stdout.strip().split("\n")[-1])
            print(
                f"{variant:<10}{row['clients']:>9,}{row['setup_s']:>10.1f}{row['partitioner_s']:>15.1f}{row['peak_mb']:>14,.0f}"
                f"{row['anon_peak_mb']:>15,.0f}  {row['checksum']:.6e}"
            )


if __name__ == "__main__":
    main()
