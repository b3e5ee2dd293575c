"""What the discovery policy adds to a FedRC round: ``FedRCStrategy(6)`` against
``FedRCStrategy(6, discovery=ConceptDiscovery())`` on the cells of ``discovery_cells.py``, CPU
seconds of this process per round over the rounds before any K event can fire (the first quarter
of a ``--rounds`` run; the events wait for a third), so both train six models. The policy's own
work (relative fits, placements, the ramp, its client-store entries) is included; training by
assignment, which skips copies, is in it too once clients are placed.

Runs alternate (paper, policy, paper, policy, ...) so that a change in the machine's load falls on
both; the ratio is taken run by run (paired) and its median printed with the machine.

    OMP_NUM_THREADS=1 python benchmarks/discovery_round_cost.py --cells main-job digits-half --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import make_trainer, quiet, set_threads  # noqa: E402
from discovery_cells import CELLS, load_average, machine  # noqa: E402

from lightning_fedcluster import ConceptDiscovery, FedRCStrategy  # noqa: E402


class RoundClock(pl.Callback):
    """Process CPU seconds of each training round (validation is off); stops the fit after
    ``stop_after`` rounds, its length (``max_epochs``, which the triggers read) unchanged."""

    def __init__(self, stop_after: int) -> None:
        self.seconds: list[float] = []
        self.stop_after = stop_after
        self._start = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.process_time()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seconds.append(time.process_time() - self._start)
        if len(self.seconds) >= self.stop_after:
            trainer.should_stop = True


def round_seconds(cell: str, policy: bool, seed: int, rounds: int) -> float:
    """Median CPU seconds of rounds 2 .. rounds // 4 (round 1 pays the one-off setup)."""
    pl.seed_everything(seed, verbose=False)
    dm, model = CELLS[cell].build(seed)
    discovery = ConceptDiscovery() if policy else None
    strategy = FedRCStrategy(6, discovery=discovery, **CELLS[cell].recipe, seed=seed)
    clock = RoundClock(stop_after=rounds // 4)
    trainer = make_trainer(strategy, rounds, validate=False, callbacks=[clock])
    trainer.fit(model, datamodule=dm)
    return statistics.median(clock.seconds[1:])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=["main-job", "digits-half"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40, help="the run length the triggers read")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 8:
        parser.error("--repeats must be at least 1 and --rounds at least 8")
    set_threads(1)
    quiet()
    print(f"machine: {machine()}, load {load_average()}, torch threads 1", flush=True)
    print("| cell | paper FedRC, CPU s a round | policy | policy / paper (paired median) |")
    print("|---|---|---|---|")
    for cell in args.cells:
        paper, policy = [], []
        for _ in range(args.repeats):
            paper.append(round_seconds(cell, False, args.seed, args.rounds))
            policy.append(round_seconds(cell, True, args.seed, args.rounds))
        ratio = statistics.median(b / a for a, b in zip(paper, policy, strict=True))
        print(
            f"| {cell} | {statistics.median(paper):.3f} | {statistics.median(policy):.3f} | {ratio:.3f} |",
            flush=True,
        )
    print(f"load at the end {load_average()}")


if __name__ == "__main__":
    main()
