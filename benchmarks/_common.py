"""Shared helpers of the benchmarks: machine line, peak RSS, quiet trainers,
a per-round timer that splits each round by the engine's phase timers, and W1-shaped data."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_fedcluster import FederatedDataModule
from lightning_fedcluster.module import PHASES

ROUND_KEYS = ("round", *PHASES, "other")
_clock: Callable[[], float] = time.perf_counter
CLOCK_HELP = (
    "cpu: CPU seconds of this process with 1 torch thread (robust when other jobs share the machine; "
    "the engine's phase timers are switched to the same clock); wall: wall-clock seconds"
)


def set_clock(kind: str) -> None:
    """Measure rounds and the engine's phases in wall seconds or in this process's CPU seconds.

    The CPU clock needs one torch thread (with more, CPU seconds add up over threads). It exists
    because this machine is shared: wall time swings by 2x or more with other jobs' load.
    """
    global _clock
    import lightning_fedcluster.engine.runtime as engine

    if kind == "cpu":
        # Lightning sets torch's thread count from OMP_NUM_THREADS when a trainer starts (to the
        # core count when unset), so pin both.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
        _clock = time.process_time
        engine.time = types.SimpleNamespace(perf_counter=time.process_time)  # the phase timers
    elif kind == "wall":
        _clock = time.perf_counter
        engine.time = time
    else:
        raise ValueError(f"clock must be 'cpu' or 'wall', got {kind!r}")


def profiled(function: Callable[[], Any], path: str | None) -> Any:
    """Call ``function``; with a path, under cProfile timed by the benchmark clock, saved there."""
    if not path:
        return function()
    import cProfile

    profiler = cProfile.Profile(_clock)
    try:
        return profiler.runcall(function)
    finally:
        profiler.dump_stats(path)


def clock() -> float:
    """The benchmark clock chosen with ``set_clock`` (wall by default); once CUDA is in use it
    waits for the GPU's queued work first, so a GPU round is timed to its end."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return _clock()


def set_threads(threads: int) -> None:
    """Fix torch's intra-op threads; Lightning keeps them only if OMP_NUM_THREADS says the same."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def quiet() -> None:
    """Silence Lightning's info messages and the usual warnings (benchmarks print tables only)."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """Machine, versions, thread count and current load: printed with every table."""
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    clock_name = "CPU seconds of this process" if _clock is time.process_time else "wall seconds"
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"machine: {cpu_model()} ({platform.machine()}), {os.cpu_count()} cores{gpu}, load avg {load}; "
        f"python {platform.python_version()}, torch {torch.__version__}, lightning {pl.__version__}, "
        f"torch threads {torch.get_num_threads()}, matmul {gemm_gflops():.0f} GFLOP/s (wall); times in "
        f"{clock_name}"
    )


def gemm_gflops(seconds: float = 0.5, size: int = 1024) -> float:
    """Float32 matmul throughput right now (GFLOP/s at the current thread count): a calibration
    printed with the tables, because this machine's speed varies by up to 2x over minutes."""
    a = torch.randn(size, size)
    a @ a
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ a
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - start) / 1e9


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    """Restart the kernel's peak-RSS counter (VmHWM) of this process, so that ``fit_peak_rss_mb``
    measures one phase (Linux >= 4.0; elsewhere the process's peak so far stays)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def fit_peak_rss_mb() -> float:
    """Peak RSS since ``reset_peak_rss`` (VmHWM), in MB; the process's peak where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return peak_rss_mb()


def current_rss_mb() -> float:
    """Current resident set size, in MB (from /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def make_trainer(
    strategy: Any, rounds: int, *, validate: bool, callbacks: Sequence[pl.Callback] = (), **overrides: Any
) -> pl.Trainer:
    """A quiet CPU trainer: one epoch per round, validation every round when ``validate``."""
    options: dict[str, Any] = dict(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=rounds,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
    )
    if validate:
        options["check_val_every_n_epoch"] = 1
    else:
        options["limit_val_batches"] = 0
    options.update(overrides)
    return pl.Trainer(**options)


class RoundTimer(pl.Callback):
    """Wall time of every round (train epoch start to end, validation included) and its split
    into the engine's phases (differences of the cumulative ``module.phase_seconds``)."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, float]] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._phases = dict(pl_module.phase_seconds)
        self._start = clock()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        row = {"round": clock() - self._start}
        for phase in PHASES:
            row[phase] = pl_module.phase_seconds[phase] - self._phases[phase]
        row["other"] = row["round"] - sum(row[p] for p in PHASES)
        self.rounds.append(row)


class TrainValidateTimer(pl.Callback):
    """Per epoch, the training time (the epoch less the validation Lightning runs inside it) and
    each validation's time and metrics (``module.eval_metrics``, keyed by the rounds trained);
    a sanity check counts as a validation after 0 rounds."""

    def __init__(self) -> None:
        self.train: list[float] = []
        self.validate: list[float] = []
        self.metrics: dict[int, dict[str, float]] = {}
        self._inner = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start, self._inner = clock(), 0.0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validation_start = clock()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seconds = clock() - self._validation_start  # after the module's epoch end: its metrics are set
        self.validate.append(seconds)
        self._inner += seconds
        rounds = 0 if trainer.sanity_checking else trainer.current_epoch + 1
        self.metrics[rounds] = dict(getattr(pl_module, "eval_metrics", {}))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train.append(clock() - self._start - self._inner)


def summarise(rows: Sequence[dict[str, float]], warmup: int) -> dict[str, float]:
    """Median of every column over the rounds after ``warmup``; also the fastest round."""
    kept = list(rows[warmup:]) or list(rows)
    summary = {key: statistics.median(r[key] for r in kept) for key in kept[0]}
    summary["min_round"] = min(r["round"] for r in kept)
    summary["measured_rounds"] = float(len(kept))
    return summary


def random_clients(
    num_clients: int,
    train_size: int,
    test_size: int,
    sample_shape: Sequence[int],
    num_classes: int = 10,
    seed: int = 0,
) -> tuple[list, list]:
    """Per-client (x, y) splits of uniform [0, 1] inputs and uniform labels (timing does not
    depend on content)."""
    generator = torch.Generator().manual_seed(seed)
    train, test = [], []
    for _ in range(num_clients):
        x = torch.rand(train_size + test_size, *sample_shape, generator=generator)
        y = torch.randint(0, num_classes, (train_size + test_size,), generator=generator)
        train.append((x[:train_size], y[:train_size]))
        test.append((x[train_size:], y[train_size:]))
    return train, test


def w1_datamodule(
    num_clients: int = 30, train_size: int = 180, test_size: int = 45, batch_size: int = 128, seed: int = 0
) -> FederatedDataModule:
    """W1's data: FashionMNIST-shaped [1, 28, 28] random inputs, 10 classes, no global clients."""
    train, test = random_clients(num_clients, train_size, test_size, (1, 28, 28), seed=seed)
    return FederatedDataModule(train, test, num_classes=10, batch_size=batch_size)


def fmt_row(name: str, summary: dict[str, float], keys: Sequence[str] = ROUND_KEYS, width: int = 10) -> str:
    return f"{name:<34}" + "".join(f"{summary.get(k, float('nan')):>{width}.3f}" for k in keys)


def header(keys: Sequence[str] = ROUND_KEYS, width: int = 10) -> str:
    names = {
        "round": "s/round",
        "e_step": "e_step",
        "local_training": "train",
        "aggregation": "aggr",
        "evaluation": "eval",
        "other": "other",
    }
    return f"{'':<34}" + "".join(f"{names.get(k, k):>{width}}" for k in keys)


def command_line() -> str:
    return "python " + " ".join(sys.argv)


def add_grouping_arguments(parser: argparse.ArgumentParser) -> None:
    """FedRC's concept-grouping options as flags (``--group-share/-assign/-margin/-hold/-late-round``,
    ``--group-ramp/-retire/-release/-release-rounds``, and ``--omega-weighting-from``, meant for the
    round after the grouping; ``--group-round`` is each script's own, since its help differs)."""
    parser.add_argument("--group-share", type=float, default=0.9, help="grouped clients' ω on their cluster")
    parser.add_argument(
        "--group-assign", choices=("medoid", "mean"), default="medoid", help="FedRC's group_assign"
    )
    parser.add_argument("--group-margin", type=float, default=None, help="FedRC's group_margin")
    parser.add_argument("--group-hold", type=int, default=0, help="FedRC's group_hold (rounds)")
    parser.add_argument("--group-late-round", type=int, default=None, help="FedRC's group_late_round")
    parser.add_argument("--group-ramp", type=int, default=0, help="FedRC's group_ramp (held rounds)")
    retire_help = "FedRC's group_retire (a share of the rows; with --group-margin)"
    parser.add_argument("--group-retire", type=float, default=None, help=retire_help)
    release_help = "FedRC's group_release (nats per sample; with --group-hold)"
    parser.add_argument("--group-release", type=float, default=None, help=release_help)
    rounds_help = "FedRC's group_release_rounds (held rounds in a row)"
    parser.add_argument("--group-release-rounds", type=int, default=None, help=rounds_help)
    omega_help = "FedRC's omega_weighting_from (a round index, e.g. the --group-round)"
    parser.add_argument("--omega-weighting-from", type=int, default=None, help=omega_help)
    ramp_help = "FedRC's omega_weighting_ramp (rounds; with --omega-weighting-from)"
    parser.add_argument("--omega-weighting-ramp", type=int, default=0, help=ramp_help)
    strength_help = "FedRC's omega_weighting_strength (in (0, 1]; with --omega-weighting-from)"
    parser.add_argument("--omega-weighting-strength", type=float, default=1.0, help=strength_help)
    clip_help = "the strategy's gradient_clip_val (each cluster copy's local gradient norm bound)"
    parser.add_argument("--gradient-clip-val", type=float, default=None, help=clip_help)


def grouping_options(args: argparse.Namespace) -> dict[str, Any]:
    """FedRCStrategy's grouping arguments from the flags of :func:`add_grouping_arguments` (the
    defaults are left out, so the strategy's own apply; a flag given without ``--group-round`` is
    passed on, and the strategy refuses it by name)."""
    options: dict[str, Any] = {}
    if args.group_round is not None:
        options["group_round"] = args.group_round
    if args.group_round is not None or args.group_share != 0.9:
        options["group_share"] = args.group_share
    if args.group_assign != "medoid":
        options["group_assign"] = args.group_assign
    if args.group_margin is not None:
        options["group_margin"] = args.group_margin
    if args.group_hold:
        options["group_hold"] = args.group_hold
    if args.group_late_round is not None:
        options["group_late_round"] = args.group_late_round
    if args.group_ramp:
        options["group_ramp"] = args.group_ramp
    if args.group_retire is not None:
        options["group_retire"] = args.group_retire
    if args.group_release is not None:
        options["group_release"] = args.group_release
    if args.group_release_rounds is not None:
        options["group_release_rounds"] = args.group_release_rounds
    if args.omega_weighting_from is not None:
        options["omega_weighting_from"] = args.omega_weighting_from
    if args.omega_weighting_ramp:
        options["omega_weighting_ramp"] = args.omega_weighting_ramp
    if args.omega_weighting_strength != 1.0:
        options["omega_weighting_strength"] = args.omega_weighting_strength
    if args.gradient_clip_val is not None:
        options["gradient_clip_val"] = args.gradient_clip_val
    return options


def fedrc_keywords(options: dict[str, Any]) -> dict[str, Any]:
    """``FedRCStrategy``'s (``FedEMStrategy``'s) keywords from a benchmark's flat options: the
    ``FedRC.Config`` options (flags, a configuration's dict) go into ``config=FedRC.Config(...)``,
    the others stay the strategy's; no Config option: no ``config`` (the paper's defaults)."""
    from lightning_fedcluster.algorithms import FedRC
    from lightning_fedcluster.strategies.fedrc import config_options

    rule = set(config_options())
    config = {name: value for name, value in options.items() if name in rule}
    keywords = {name: value for name, value in options.items() if name not in rule}
    return {**keywords, "config": FedRC.Config(**config)} if config else keywords
