"""This library against a plain Flower app on the same federated workloads: seconds per round (wall,
and CPU seconds of the whole process tree), the process tree's peak memory, and accuracy on the
same held-out rows after the same rounds.

Both sides get the same clients, model, initial weights, optimizer (SGD with the same lr and
momentum, fresh every round), batch size, one local epoch of shuffled minibatches with a partial
last batch, rounds and seed:

  (a) this library: ``lightning.pytorch.Trainer`` + ``FedAvgStrategy``, one run per executor;
  (b) a plain Flower app (``_flower_app.py``): flwr's Message-API ``ServerApp`` with
      ``flwr.serverapp.strategy.FedAvg``, a ``ClientApp`` with an ordinary PyTorch loop, run by
      ``flwr.simulation.run_simulation`` on its Ray backend with its default settings.

Workloads (the data is fixed; ``--seeds`` vary the initial weights and the shuffling):

  W1  30 clients x 180 rows of digits-28 (scikit-learn's digits, bilinear 8x8 -> 28x28; each client
      draws its rows from a 1,500-row pool, so clients overlap), FashionCNN (2.17 M parameters),
      batch 128 (2 steps a round per client), SGD lr 0.05 momentum 0.9; held out: the other 297.
  W2  FedEM's synthetic task, 300 clients (61,307 rows, 640 steps a round), linear model, batch
      128, SGD lr 0.1; held out: every client's 20 % test rows (15,336).

The sides run interleaved: for each seed (and each of ``--repeats``), one run of every side in
turn, so that a busy machine's drift reaches all sides alike; the ratios are also given run by run
(paired). Every run is a fresh child process with the same torch thread count (``--threads``, set as
``OMP_NUM_THREADS`` and ``torch.set_num_threads`` on both sides, in Ray's workers too). A sampler
thread reads the child's process tree (the child and all its descendants, Ray's processes
included) every 0.2 s: CPU seconds (user + system, summed over every process seen) and the sum of
resident set sizes. s/round is the median over the rounds after the first.

    python benchmarks/flower_app_side_by_side.py                        # W1 and W2, seed 0, 5 rounds
    python benchmarks/flower_app_side_by_side.py --seeds 0 1 2 --rounds 5
    python benchmarks/flower_app_side_by_side.py --repeats 3 --executors loop   # paired, loop only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import command_line, machine_line, quiet, set_threads

HERE = Path(__file__).resolve().parent
SAMPLE_SECONDS = 0.2
EXECUTORS = ("loop", "vectorized")
WORKLOADS: dict[str, dict[str, Any]] = {
    "W1": {"model": "cnn", "lr": 0.05, "momentum": 0.9, "batch": 128, "executors": EXECUTORS},
    "W2": {"model": "linear-150-2", "lr": 0.1, "momentum": 0.0, "batch": 128, "executors": EXECUTORS},
}


# ----------------------------------------------------------------------------- data
def w1_data() -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """30 clients x 180 digits-28 rows from a 1,500-row pool; the other 297 rows held out."""
    from authors_data import digits_28

    x, y = digits_28()
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(y), generator=generator)
    pool, held_out = order[:1500], order[1500:]
    clients = []
    for _ in range(30):
        rows = pool[torch.randperm(len(pool), generator=generator)[:180]]
        clients.append((x[rows].contiguous(), y[rows].contiguous()))
    return clients, x[held_out].contiguous(), y[held_out].contiguous()


def w2_data() -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """FedEM's synthetic task (300 clients); held out: every client's test rows."""
    from lightning_fedcluster.datamodules import FedEMSynthetic

    dm = FedEMSynthetic(num_clients=300, seed=0)
    clients = [tuple(t.clone() for t in dm.train_split(i)) for i in range(dm.num_clients)]
    return clients, torch.cat([dm.val_x, dm.test_x]), torch.cat([dm.val_y, dm.test_y])


DATA: dict[str, Callable[[], tuple[list, torch.Tensor, torch.Tensor]]] = {"W1": w1_data, "W2": w2_data}


def initial_weights(model: str, seed: int) -> dict[str, torch.Tensor]:
    """The model's initial weights for ``seed`` (the Flower app's model class; the library's
    reference model is checked to start from the same numbers)."""
    from _flower_app import build_model

    torch.manual_seed(seed)
    return {k: v.clone() for k, v in build_model(model).state_dict().items()}


def library_model(model: str, lr: float, momentum: float) -> Any:
    from lightning_fedcluster.models import FashionCNN, MLPClassifier

    if model == "cnn":
        return FashionCNN(lr=lr, momentum=momentum)
    _, features, classes = model.split("-")
    return MLPClassifier(int(features), int(classes), hidden=(), lr=lr, momentum=momentum)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of held-out rows classified right (the same code for both sides)."""
    model.eval()
    with torch.no_grad():
        right = sum(int((model(x[i : i + 1024]).argmax(1) == y[i : i + 1024]).sum()) for i in range(0, len(y), 1024))  # noqa: E501
    return right / len(y)


# ----------------------------------------------------------------------------- measuring
def import_psutil() -> Any:
    """psutil; where it is not installed, the copy bundled with Ray (the Flower side needs Ray),
    found without importing Ray itself, so the library's runs do not load it."""
    try:
        import psutil
    except ImportError:
        spec = importlib.util.find_spec("ray")
        if spec is None or not spec.submodule_search_locations:
            needs = "this benchmark needs psutil or Ray: pip install 'lightning-fedcluster[flower]'"
            raise SystemExit(needs) from None
        sys.path.append(os.path.join(spec.submodule_search_locations[0], "thirdparty_files"))
        import psutil
    return psutil


class ProcessTree:
    """CPU seconds and resident memory of this process and all its descendants, read by a
    background thread every ``SAMPLE_SECONDS`` and on demand (``cpu_seconds``)."""

    def __init__(self) -> None:
        psutil = import_psutil()
        self._psutil = psutil
        self.root = psutil.Process()
        self.cpu: dict[tuple[int, float], float] = {}
        self.peak_rss = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.cpu_seconds()

    def cpu_seconds(self) -> float:
        """Sample the tree now; CPU seconds of every process seen so far (exited ones at their
        last sample)."""
        with self._lock:
            rss = 0
            for process in [self.root, *self.root.children(recursive=True)]:
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        self.cpu[(process.pid, process.create_time())] = times.user + times.system
                        rss += process.memory_info().rss
                except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            return sum(self.cpu.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_seconds()


class Rounds:
    """Wall and tree-CPU marks at each round's start and end."""

    def __init__(self, tree: ProcessTree) -> None:
        self.tree = tree
        self.rows: list[dict[str, float]] = []
        self._start: tuple[float, float] | None = None

    def start(self) -> None:
        self._start = (time.perf_counter(), self.tree.cpu_seconds())

    def end(self) -> None:
        assert self._start is not None
        wall, cpu = time.perf_counter(), self.tree.cpu_seconds()
        self.rows.append({"wall": wall - self._start[0], "cpu": cpu - self._start[1]})


# ----------------------------------------------------------------------------- the two sides
def run_library(spec: dict[str, Any], data_path: str, rounds: int, seed: int, threads: int, tree: ProcessTree,
                executor: str) -> dict[str, Any]:
    import lightning.pytorch as pl

    from lightning_fedcluster import ClusteredModule, FedAvgStrategy, FederatedDataModule

    set_threads(threads)
    clients, test_x, test_y = torch.load(data_path)
    model = library_model(spec["model"], spec["lr"], spec["momentum"])
    module = ClusteredModule(model, 1, seed=seed)
    initial = initial_weights(spec["model"], seed)
    module.models[0].load_state_dict(initial)
    marks = Rounds(tree)

    class Marks(pl.Callback):
        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            marks.start()

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            marks.end()

    # The held-out rows are the benchmark's own evaluation; the datamodule gets a few as test rows.
    tests = [(test_x[i :: len(clients)], test_y[i :: len(clients)]) for i in range(len(clients))]
    dm = FederatedDataModule(clients, tests, batch_size=spec["batch"], seed=seed)
    strategy = FedAvgStrategy(local_epochs=1, seed=seed, executor=executor)
    trainer = pl.Trainer(
        strategy=strategy, accelerator="cpu", devices=1, max_epochs=rounds, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Marks()],
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    return {"rounds": marks.rows, "accuracy": accuracy(module.models[0], test_x, test_y),
            "executor": module.executor}  # fmt: skip


def run_flower(spec: dict[str, Any], data_path: str, rounds: int, seed: int, threads: int,
               tree: ProcessTree) -> dict[str, Any]:
    import logging

    from _flower_app import build_model, client_app, server_app
    from flwr.simulation import run_simulation

    torch.set_num_threads(threads)
    clients, test_x, test_y = torch.load(data_path)
    partitions = str(Path(data_path).with_suffix(".clients.pt"))
    torch.save(clients, partitions)
    marks = Rounds(tree)

    def evaluate_fn(server_round: int, arrays: Any) -> None:
        """Flower's server-side evaluation hook, called before round 1 and after every round:
        here it marks the rounds, and scores the last round's model on the held-out rows."""
        if server_round > 0:
            marks.end()
        if server_round == rounds:
            model = build_model(spec["model"])
            model.load_state_dict(arrays.to_torch_state_dict())
            result["accuracy"] = accuracy(model, test_x, test_y)
        marks.start()

    config = {"data": partitions, "model": spec["model"], "lr": spec["lr"], "momentum": spec["momentum"],
              "batch-size": spec["batch"], "local-epochs": 1, "seed": seed, "threads": threads}  # fmt: skip
    result: dict[str, Any] = {}
    app = server_app(initial_weights(spec["model"], seed), rounds, config, evaluate_fn, result)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(server_app=app, client_app=client_app, num_supernodes=len(clients))
    if "accuracy" not in result:
        raise RuntimeError("the Flower simulation ended before its last round")
    return {"rounds": marks.rows[: rounds], "accuracy": result["accuracy"], "executor": "-"}


def child(args: argparse.Namespace) -> None:
    """One run in this process: print its measurements as one JSON line."""
    quiet()
    tree = ProcessTree()
    start = time.perf_counter()
    spec = WORKLOADS[args.workload]
    if args.side == "flower":
        out = run_flower(spec, args.data, args.rounds, args.seed, args.threads, tree)
    else:
        out = run_library(spec, args.data, args.rounds, args.seed, args.threads, tree, args.side)
    tree.stop()
    out.update(total_wall=time.perf_counter() - start, total_cpu=sum(tree.cpu.values()),
               peak_rss_mb=tree.peak_rss / 2**20)  # fmt: skip
    print("RESULT " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- the table
def measure(side: str, workload: str, data: str, rounds: int, seed: int, threads: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", side, "--workload", workload, "--data", data,
               "--rounds", str(rounds), "--seed", str(seed), "--threads", str(threads)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{side} on {workload} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "process_wall": time.perf_counter() - start}


def run_median(run: dict[str, Any], key: str) -> float:
    """One run's median seconds a round (``key``: "wall" or "cpu") over the rounds after the first."""
    return statistics.median(row[key] for row in (run["rounds"][1:] or run["rounds"]))


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the rounds after the first (over all seeds), and the mean accuracy."""
    kept = [row for run in runs for row in (run["rounds"][1:] or run["rounds"])]
    return {
        "wall": statistics.median(r["wall"] for r in kept),
        "cpu": statistics.median(r["cpu"] for r in kept),
        "start_end": statistics.median(r["process_wall"] - sum(x["wall"] for x in r["rounds"]) for r in runs),
        "rss": max(r["peak_rss_mb"] for r in runs),
        "accuracy": [r["accuracy"] for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=tuple(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default 1)")
    parser.add_argument("--clients", type=int, default=0, help="the first N clients only (0: all)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every side per seed, interleaved")
    parser.add_argument("--executors", nargs="+", choices=EXECUTORS, default=list(EXECUTORS),
                        help="the library's executors to run (default: both)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.side = args.child
        child(args)
        return
    if args.rounds < 2:
        raise SystemExit(f"--rounds must be >= 2 (the first round is left out of s/round), got {args.rounds}")
    set_threads(args.threads)
    print(machine_line())
    print(f"command: {command_line()}")
    seeds = " ".join(map(str, args.seeds))
    print(f"{args.rounds} rounds; seeds: {seeds}; runs per seed and side: {args.repeats}, interleaved; "
          f"torch threads per process: {args.threads} on both sides;"
          " s/round: median over the rounds after the first (wall, and CPU seconds of "
          "the whole process tree); peak RSS: the tree's largest sampled sum; start + end: the run's process "
          "from start to exit, less its rounds")
    with tempfile.TemporaryDirectory() as folder:
        for workload in args.workloads:
            clients, test_x, test_y = DATA[workload]()
            if args.clients:
                clients = clients[: args.clients]
            spec = WORKLOADS[workload]
            check_same_start(spec)
            data = str(Path(folder) / f"{workload}.pt")
            torch.save((clients, test_x, test_y), data)
            executors = [e for e in spec["executors"] if e in args.executors]
            sides = [*executors, "flower"]
            runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for seed in args.seeds:
                for _ in range(args.repeats):
                    for side in sides:  # interleaved: each side once, then again
                        runs[side].append(measure(side, workload, data, args.rounds, seed, args.threads))
            rows = {side: summary(runs[side]) for side in sides}
            steps = sum(-(-len(y) // spec["batch"]) for _, y in clients)
            rows_total = sum(len(y) for _, y in clients)
            print(f"\n{workload}: {len(clients)} clients, {rows_total} training rows, {steps} "
                  f"local steps a round, model {spec['model']}, batch {spec['batch']}, SGD lr {spec['lr']} "
                  f"momentum {spec['momentum']}; accuracy on {len(test_y)} held-out rows")
            print(f"{'':<34}{'wall s/round':>13}{'CPU s/round':>12}{'start + end':>12}{'peak RSS MB':>12}"
                  f"{'accuracy':>10}")  # fmt: skip
            for side in sides:
                row = rows[side]
                name = "Flower app (Ray, defaults)" if side == "flower" else f"this library ({side})"
                accuracies = " ".join(f"{a:.3f}" for a in row["accuracy"])
                print(f"{name:<34}{row['wall']:>13.3f}{row['cpu']:>12.3f}{row['start_end']:>12.1f}"
                      f"{row['rss']:>12.0f}  {accuracies}")  # fmt: skip
            flower = rows["flower"]
            for side in executors:
                cpu = flower["cpu"] / rows[side]["cpu"]
                print(f"  Flower / this library ({side}): CPU s/round {cpu:.2f}x, "
                      f"wall s/round {flower['wall'] / rows[side]['wall']:.2f}x, "
                      f"peak RSS {flower['rss'] / rows[side]['rss']:.2f}x")
                if len(runs[side]) > 1:
                    for key in ("cpu", "wall"):
                        paired = [run_median(f, key) / run_median(mine, key)
                                  for f, mine in zip(runs["flower"], runs[side], strict=True)]
                        print(f"    paired run by run, {key}: median {statistics.median(paired):.2f}x, runs "
                              + " ".join(f"{r:.2f}" for r in paired))


def check_same_start(spec: dict[str, Any]) -> None:
    """The Flower app's model and the library's reference model have the same parameters, so one
    seed starts both sides from the same weights."""
    mine = library_model(spec["model"], spec["lr"], spec["momentum"]).state_dict()
    theirs = initial_weights(spec["model"], 0)
    if {k: tuple(v.shape) for k, v in mine.items()} != {k: tuple(v.shape) for k, v in theirs.items()}:
        raise SystemExit(f"the Flower app's {spec['model']} does not have the library model's parameters")


if __name__ == "__main__":
    main()
