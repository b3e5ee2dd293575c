"""FedRC (K=3) against FedAvg (FedRC with K=1) on the main job's scenario, over several seeds.

DigitsFederated: 30 clients, three concepts (identity, 9−y, (y+1) mod 10), Dirichlet(1.0)
label shift, the FedRC paper's client-type mix with corrupted clients; 10 clients per round,
5 local steps of batch 32, SGD lr 0.2, 150 rounds. Prints a table (mean ± std and per seed)
and the machine; results are recorded in benchmarks/results/compare_algorithms.md.

    python benchmarks/digits_concepts.py --seeds 0 1 2 3 4 5

Options for the dead-cluster and server-optimizer studies: ``--lr``/``--momentum``
(the local SGD), ``--optimizer-state reset|persist``, ``--server-optimizer``/``--server-lr``,
``--reseed-threshold δ`` (FedRCStrategy's re-seeding of dead clusters) and ``--fedrc-only``. At
the end, ``clusters used`` counts the clusters that some seen client's largest mixture weight
points to, ``clusters alive`` those that explain at least 5 % of the seen clients' data (3 =
none died); the per-seed line adds the models still held (``active``: not retired by a merge).

The concept grouping: ``--group-round`` and the robust grouping's ``--group-assign/-margin/-hold/
-late-round`` (``_common.add_grouping_arguments``; the quick start's configuration is
``--group-round 20 --group-assign mean --group-margin 0.7 --group-hold 10 --group-late-round 25``).
The take-off study's spurious-cluster checks: ``--concepts 1`` (DigitsFederated's concept count) with
``--group-round``/``--merge-threshold``/``--merge-after``/``--retire-after``, and
``--num-clusters 6`` on three concepts; ``--show-merges`` prints each merge's and retirement's note.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from _common import add_grouping_arguments, fedrc_keywords, grouping_options, make_trainer
from _takeoff_variants import anneal

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.algorithms.discovery.protocol import cluster_shares
from lightning_fedcluster.callbacks.takeoff_diagnostics import TakeoffDiagnostics
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier

METRICS = ("test/local_acc", "test/global_acc", "test/concept_ari", "used", "alive")
ALIVE_SHARE = 0.05  # a cluster is alive when it explains at least 5 % of the seen clients' data


class _ServerNotes(logging.Filter):
    """Collects the merge and retirement notes the server says on rank zero's info channel during a fit, and
    keeps that channel's info lines off the console as before (warnings and errors pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self._logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")

    def filter(self, record: logging.LogRecord) -> bool:
        if "merged cluster" in record.getMessage() or "retired cluster" in record.getMessage():
            self.lines.append(record.getMessage())
        return record.levelno > logging.INFO

    def __enter__(self) -> _ServerNotes:
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeFilter(self)
        self._logger.setLevel(self._level)


def run(num_clusters: int, seed: int, args: argparse.Namespace) -> dict[str, float]:
    dm = DigitsFederated(num_clients=30, concepts=args.concepts, seed=seed)
    options = {}
    if args.reseed_threshold is not None and num_clusters > 1:
        options["reseed_threshold"] = args.reseed_threshold
    if args.server_optimizer != "none":
        options.update(server_optimizer=args.server_optimizer, server_lr=args.server_lr)
    if num_clusters > 1:
        options.update(grouping_options(args))
    if args.label_stats_floor is not None:
        options["label_stats_floor"] = args.label_stats_floor
    if args.merge_threshold is not None and num_clusters > 1:
        options.update(merge_threshold=args.merge_threshold, merge_after=args.merge_after)
    if args.retire_after is not None and num_clusters > 1:
        options["retire_after"] = args.retire_after
    strategy = FedRCStrategy(
        num_clusters,
        clients_per_round=10,
        local_steps=5,
        seed=seed,
        optimizer_state=args.optimizer_state,
        **fedrc_keywords(options),
    )
    anneal(strategy, args.anneal)
    callbacks = [TakeoffDiagnostics(every=args.diagnostics_every)] if args.diagnostics else []
    trainer = make_trainer(strategy, args.rounds, validate=False, callbacks=callbacks)
    notes = _ServerNotes()  # the merges' console lines (Lightning's info lines are silenced)
    start = time.perf_counter()
    with notes:
        trainer.fit(MLPClassifier(lr=args.lr, momentum=args.momentum), datamodule=dm)
    seconds = time.perf_counter() - start
    if args.show_merges:
        for line in notes.lines:
            print(f"K={num_clusters} seed {seed}: {line}")
    if args.diagnostics:
        Path(args.diagnostics).mkdir(parents=True, exist_ok=True)
        callbacks[0].save(Path(args.diagnostics) / f"k{num_clusters}-seed{seed}.json")
    result = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    state = trainer.lightning_module.client_state
    used = state.omega[state.seen].argmax(1).unique().numel()
    alive = int((cluster_shares(state.omega, dm.train_sizes, state.seen) >= ALIVE_SHARE).sum())
    active = int(state.active.sum())  # clusters not retired by a merge or a retirement
    counts = {"used": float(used), "alive": float(alive), "active": float(active), "seconds": seconds}
    return {**{m: result[m] for m in METRICS[:3]}, **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--optimizer-state", choices=("reset", "persist"), default="reset")
    parser.add_argument("--reseed-threshold", type=float, default=None)
    parser.add_argument("--server-optimizer", choices=("none", "momentum", "adam"), default="none")
    parser.add_argument("--server-lr", type=float, default=1.0, help="η_g of --server-optimizer")
    parser.add_argument(
        "--group-round", type=int, default=None, help="FedRC's concept grouping after this round"
    )
    parser.add_argument("--label-stats-floor", type=float, default=None, help="FedRC's floor of C")
    parser.add_argument("--merge-threshold", type=float, default=None, help="FedRC's cluster merging (nats)")
    parser.add_argument("--merge-after", type=int, default=0, help="first round index a merge may follow")
    parser.add_argument(
        "--retire-after", type=int, default=None, help="FedRC's retire_after (round index)"
    )
    add_grouping_arguments(parser)
    parser.add_argument(
        "--anneal", default=None, help="BETA0:ROUNDS, an annealed E-step (_takeoff_variants.py)"
    )
    parser.add_argument("--num-clusters", type=int, default=3, help="K of FedRC")
    parser.add_argument("--concepts", type=int, default=3, help="DigitsFederated's number of concepts")
    parser.add_argument(
        "--diagnostics", default=None, help="write TakeoffDiagnostics to DIR/k<K>-seed<s>.json"
    )
    parser.add_argument(
        "--diagnostics-every", type=int, default=1, help="with --diagnostics: every this many rounds"
    )
    parser.add_argument("--show-merges", action="store_true", help="print each cluster merge's note")
    parser.add_argument("--fedrc-only", action="store_true", help="skip the FedAvg (K=1) runs")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    ks = (args.num_clusters,) if args.fedrc_only else (args.num_clusters, 1)
    rows = {k: [run(k, seed, args) for seed in args.seeds] for k in ks}
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, lightning {pl.__version__}, seeds {args.seeds}"
    )
    print(
        f"SGD lr {args.lr} momentum {args.momentum}, optimizer_state={args.optimizer_state}, "
        f"reseed_threshold={args.reseed_threshold}, grouping {grouping_options(args) or 'off'}, "
        f"merge_threshold={args.merge_threshold} (after {args.merge_after}) "
        f"retire_after={args.retire_after}, "
        f"server_optimizer={args.server_optimizer} (server_lr {args.server_lr}), {args.rounds} rounds, "
        f"{args.concepts} concepts"
    )
    names = ("local acc", "global acc", "concept ARI", "clusters used", "clusters alive")
    print(f"{'model':<16}" + "".join(f"{n:>16}" for n in names) + f"{'s / run':>10}")
    for k, runs in rows.items():
        cells = []
        for metric in METRICS:
            values = [r[metric] for r in runs]
            if any(math.isnan(v) for v in values):  # the concept ARI of a one-concept scenario
                cells.append("n/a")
                continue
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}")
        name = f"FedRC K={k}" if k > 1 else "FedAvg (K=1)"
        seconds = statistics.mean(r["seconds"] for r in runs)
        print(f"{name:<16}" + "".join(f"{c:>16}" for c in cells) + f"{seconds:>10.1f}")
    print("per seed (global acc / ARI / clusters used / alive / active):")
    for k, runs in rows.items():
        cells = [
            f"s{s}: {r['test/global_acc']:.3f}/{r['test/concept_ari']:.2f}/"
            f"{r['used']:.0f}/{r['alive']:.0f}/{r['active']:.0f}"
            for s, r in zip(args.seeds, runs, strict=True)
        ]
        print(f"  K={k}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
