"""The engine's intra-op threads for a fit: one thread when each local step is too small to split.

torch splits an operation over its intra-op threads (by default one per core). A client's local
step on the quick start's MLP is a few small matrix products (about 5 MFLOP), far too little to
share: the threads spend their time waiting for each other, and on a machine where other work runs
each of them waits for a core as well (two threads took 1.7x to 3.4x as long as one for the quick
start on a loaded 2-core machine; ``benchmarks/results/quickstart.md``). So a fit sets torch's
thread count for its duration, in this order:

1. the strategy's ``num_threads`` (e.g. ``FedRCStrategy(3, num_threads=2)``);
2. ``OMP_NUM_THREADS`` as the user set it (torch already runs with it);
3. a count the user set with ``torch.set_num_threads`` after importing the library;
4. else the engine's choice: one thread when a local step of one client is below
   ``SMALL_STEP_FLOPS`` (counted once, from one forward pass on one row), otherwise torch's count.

The choice depends on the model and the batch size only, never on the machine's load, so that
the same fit on the same machine runs with the same threads (results depend on the thread count).
With several processes the engine leaves Lightning's choice (the cores divided by the processes,
the same in every process) unless ``num_threads`` is given, which every process then uses.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# A local step below this (forward and backward of one client's batch on the models it trains)
# runs on one thread: the quick start's MLP step is about 5e6, a small CNN on 32x32 images 1e9.
SMALL_STEP_FLOPS = 5e7
IMPORTED_THREADS = torch.get_num_threads()  # torch's count when the library was imported


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op threads a fit runs with, and why (said at the start of the fit)."""

    threads: int
    reason: str

    def describe(self) -> str:
        override = (
            ""
            if self.reason.startswith(("num_threads", "OMP_NUM_THREADS", "torch"))
            else ("; the strategy's num_threads or OMP_NUM_THREADS overrides it")
        )
        return f"intra-op threads: {self.threads} ({self.reason}{override})"


_users_variable: list[str | None] = []  # OMP_NUM_THREADS as the user left it, during a launch
_saved: list[int] = []  # torch's count before a fit set it, restored at the strategy's teardown


@contextlib.contextmanager
def users_variable_kept(value: str | None) -> Iterator[None]:
    """Remember the user's ``OMP_NUM_THREADS`` (None: unset) while a one-process launch, which
    sets the variable itself, runs the fit."""
    _users_variable.append(value)
    try:
        yield
    finally:
        _users_variable.pop()


def users_threads_variable() -> str | None:
    """``OMP_NUM_THREADS`` as the user set it (None: unset)."""
    return _users_variable[-1] if _users_variable else os.environ.get("OMP_NUM_THREADS")


def apply_threads(choice: ThreadChoice) -> None:
    """Run the fit with ``choice.threads`` (the count before is restored by ``restore_threads``)."""
    _saved.append(torch.get_num_threads())
    torch.set_num_threads(choice.threads)


def restore_threads() -> None:
    """torch's thread count as it was before the last ``apply_threads`` (nothing if none)."""
    if _saved:
        torch.set_num_threads(_saved.pop())


def step_flops(model: nn.Module, sample: Tensor, batch_rows: int, models_trained: int) -> float:
    """About the floating-point operations of one local step: forward and backward (3x the
    forward) of ``batch_rows`` rows on ``models_trained`` copies of ``model``, from torch's count
    of one forward pass on one row (twice the parameters per row when it cannot count)."""
    row = sample[:1]
    try:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            model(row)
        forward = float(counter.get_total_flops())
    except Exception:  # a model the counter cannot run: its parameters, as a linear model's cost
        forward = 0.0
    if forward <= 0:
        forward = 2.0 * sum(p.numel() for p in model.parameters())
    return 3.0 * forward * batch_rows * models_trained


def choose_threads(num_threads: int | None, users_variable: str | None, flops: float) -> ThreadChoice:
    """The fit's threads (see the module docstring): ``num_threads`` from the strategy,
    ``users_variable`` the ``OMP_NUM_THREADS`` the user set (None: unset), ``flops`` a local step's."""
    if num_threads is not None:
        return ThreadChoice(num_threads, f"num_threads={num_threads}")
    current = torch.get_num_threads()
    if users_variable:
        return ThreadChoice(current, f"OMP_NUM_THREADS={users_variable}")
    if current != IMPORTED_THREADS:
        return ThreadChoice(current, f"torch.set_num_threads({current}) before the fit")
    if flops < SMALL_STEP_FLOPS:
        return ThreadChoice(
            1, f"a local step is about {flops / 1e6:.1f} MFLOP, too small to split over threads"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return ThreadChoice(
        current, f"a local step is about {flops / 1e6:.0f} MFLOP: torch's {current} of {cores} cores"
    )
