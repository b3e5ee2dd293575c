"""The take-off study's runs: the take-off cells, the one-concept scenario and K started at 6, as
parallel worker processes (e.g. eight sharing one GPU), one JSON line per job, and the table that
checks them against the study's targets.

A job is (configuration, cell, seed): the authors' FashionMNIST-C recipe of
``authors_comparison.py run`` (FashionCNN, SGD lr 0.06, momentum 0.9 kept between rounds
(``optimizer_state='persist'``), weight decay 5e-4, batch 128, one local step, every client every
round) on a data set written by ``authors_comparison.py write`` (``takeoff_data.py`` writes all five).
The configurations (plain FedRC, the grouping and its variants, the K events, FedAvg) and the
job list live in ``takeoff_configs.py``; ``configs`` prints them as JSON.

Recorded per job: the concept ARI of every round, the take-off round (first round with ARI >= 0.8),
the global accuracy (the written global clients: ω fitted on their adapt rows, scored on their
score rows) every ``--eval-every`` rounds and at the last, the mean accuracy of the clients' own
test rows at those rounds (the validation signal: the best-validation round is chosen by it),
the final K (alive clusters), the clusters that explain < 5 % of the data (dead), seconds, the
``--accelerator`` and the device the module trained on (read at train start; records written
before 2026-11-26 read it after the fit, when Lightning's teardown had moved the module to the CPU,
so their ``device`` says ``cpu`` whatever the accelerator).

    PYTHONPATH=$PWD python3 benchmarks/takeoff_runs.py run --data-root /work/takeoff \\
        --accelerator cuda --workers 8 --executor vectorized --budget-s 420 --out /tmp/takeoff/jobs.jsonl
    PYTHONPATH=$PWD python3 benchmarks/takeoff_runs.py summarize /tmp/takeoff/jobs.jsonl
    python3 benchmarks/takeoff_runs.py configs

``run --list`` prints the job list; ``--only`` keeps jobs whose name contains one of the words;
``--max-jobs`` keeps the first N in priority order (the mechanism on the four cells, the
baselines, the one-concept scenario, K = 6). Finished jobs already in ``--out`` are skipped, so a
run cut short resumes where it stopped; ``--budget-s`` stops the workers after that many seconds,
keeps what finished and prints the table. A job whose ``--executor`` fails falls back to the loop
(recorded as ``fallback``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _takeoff import TAKE_OFF_ARI, take_off_round  # noqa: E402
from _takeoff_evaluation import make_evaluation  # noqa: E402
from takeoff_configs import CELLS, CONFIGS, MNIST_CELLS, ONE_CONCEPT, Job, job_list  # noqa: E402

DEAD_SHARE = 0.05  # a cluster explaining less of the data than this is recorded as dead


@dataclass
class Settings:
    data_root: str
    rounds: int
    accelerator: str
    precision: str
    eval_every: int
    threads: int
    executor: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)


def run_job(job: Job, settings: Settings) -> dict[str, Any]:
    """Train one job and return its record (errors are recorded, not raised)."""
    start = time.time()
    try:
        return {**execute(job, settings), "seconds": time.time() - start}
    except Exception:  # noqa: BLE001 - one failed job must not stop the others
        if settings.executor != "loop":  # an executor that fails here: the loop runs every rule
            first = traceback.format_exc().strip().splitlines()[-1]
            record = run_job(job, replace(settings, executor="loop"))
            return {**record, "fallback": f"executor {settings.executor} failed ({first}); ran the loop"}
        return {
            **asdict(job),
            "name": job.name,
            "error": traceback.format_exc(),
            "seconds": time.time() - start,
        }


def execute(job: Job, settings: Settings) -> dict[str, Any]:
    import torch
    from _common import make_trainer, quiet, set_threads
    from _takeoff_variants import true_concepts
    from authors_comparison import authors_model, make_strategy, read

    from lightning_fedcluster import FedAvgStrategy
    from lightning_fedcluster.algorithms.discovery.protocol import cluster_shares

    quiet()
    set_threads(settings.threads)  # with OMP_NUM_THREADS, or the launcher resets it to the cores
    kind, k, options = CONFIGS[job.config]
    dm, global_clients, manifest = read(Path(settings.data_root) / job.cell)
    torch.manual_seed(job.seed)
    model, _ = authors_model()
    if kind == "fedavg":
        strategy = FedAvgStrategy(
            local_steps=1,
            clients_per_round=None,
            seed=job.seed,
            optimizer_state="persist",
            executor=settings.executor,
        )
    else:
        strategy, state = make_strategy("persist", job.seed, {**options, "executor": settings.executor}, k)
        assert state == "persist"
        if kind == "true":  # the ceiling: every client's concept given
            strategy = true_concepts(strategy, dm.metadata.concept)
    floor = options.get("label_stats_floor", 1e-8)
    true_models = kind == "true"
    evaluation = make_evaluation(settings.eval_every, floor, job.name, true_models)(global_clients)
    trainer = make_trainer(
        strategy,
        settings.rounds,
        validate=False,
        callbacks=[evaluation],
        precision=settings.precision,
        accelerator=settings.accelerator,
    )
    fit_start = time.time()
    trainer.fit(model, datamodule=dm)
    fit_seconds = time.time() - fit_start
    rows = evaluation.rows
    state = trainer.lightning_module.client_state
    concepts = sorted({c["concept"] for c in manifest["clients"]})
    scored = [r for r in rows if "acc" in r]
    best = max(scored, key=lambda r: (r["val"], -r["round"]))
    shares = cluster_shares(state.omega, dm.train_sizes, state.seen)
    alive = state.active.nonzero().flatten().tolist()
    ari = [r["ari"] for r in rows]
    keys = ("round", "scores", "log_c")  # each round's owners are in "owners"
    merge_rows = [{key: r[key] for key in keys} for r in rows if "scores" in r]
    return {
        **asdict(job),
        "name": job.name,
        "k_start": k,
        "options": options,
        "concepts": concepts,
        "rounds": len(rows),
        "ari": ari,
        "alive": [r["alive"] for r in rows],
        "take_off": take_off_round((r["round"], r["ari"]) for r in rows),
        "scored": {
            r["round"]: {key: r[key] for key in ("acc", "val", "acc_true") if key in r} for r in scored
        },
        "acc25": next((r["acc"] for r in scored if r["round"] == 25), None),
        "acc60": next((r["acc"] for r in scored if r["round"] == 60), None),
        "acc_last": scored[-1]["acc"],
        "best_val_round": best["round"],
        "acc_best_val": best["acc"],
        "final_k": len(alive),
        "dead": sum(float(shares[c]) < DEAD_SHARE for c in alive),
        "used": int(state.omega[state.seen].argmax(1).unique().numel()),
        "device": evaluation.device,
        "accelerator": settings.accelerator,
        "executor": trainer.lightning_module.executor,
        "fit_seconds": fit_seconds,
        "owners": [r["owner"] for r in rows],
        **({"merge_scores": merge_rows} if merge_rows else {}),
        **({"held": [r["held"] for r in rows]} if rows and "held" in rows[0] else {}),
    }


def _worker(item: tuple[Job, Settings]) -> dict[str, Any]:
    return run_job(*item)


def run(args: argparse.Namespace) -> None:
    jobs = job_list(args.seeds)
    if args.only:
        jobs = [j for j in jobs if any(word in j.name for word in args.only)]
    jobs = jobs[: args.max_jobs]
    if args.list:
        for job in jobs:
            print(job.name)
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {json.loads(line)["name"] for line in out.read_text().splitlines() if line.strip()}
    todo = [j for j in jobs if j.name not in done]
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.workers))
    settings = Settings(
        args.data_root, args.rounds, args.accelerator, args.precision, args.eval_every, threads, args.executor
    )
    print(
        f"{len(todo)} jobs ({len(jobs) - len(todo)} already in {out}), {args.workers} workers, "
        f"{threads} torch threads each, {args.accelerator}, executor {args.executor}, {args.rounds} rounds, "
        f"precision {args.precision}",
        flush=True,
    )
    start = time.time()
    context = mp.get_context("spawn")
    finished = 0
    with context.Pool(args.workers) as pool, out.open("a") as sink:
        results = pool.imap_unordered(_worker, [(j, settings) for j in todo])
        while finished < len(todo):
            left = None if args.budget_s is None else args.budget_s - (time.time() - start)
            try:
                record = results.next(timeout=left) if left is None or left > 0 else None
            except mp.TimeoutError:
                record = None
            if record is None:
                print(
                    f"time budget of {args.budget_s} s spent: {len(todo) - finished} jobs not finished",
                    flush=True,
                )
                pool.terminate()
                break
            finished += 1
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            status = "ERROR" if "error" in record else f"take-off {record['take_off']}, K {record['final_k']}"
            print(
                f"[{time.time() - start:6.0f} s] {record['name']}: {status} ({record['seconds']:.0f} s)",
                flush=True,
            )
            if "error" in record:
                print(record["error"], flush=True)
            if "fallback" in record:
                print(f"  {record['fallback']}", flush=True)
    print(f"{finished} jobs done in {time.time() - start:.0f} s", flush=True)
    summarize(argparse.Namespace(records=str(out), rounds=args.rounds))


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


def _mean(values: list[float | None], scale: float = 100.0) -> str:
    present = [v for v in values if v is not None]
    return f"{scale * statistics.mean(present):.1f}" if present else "-"


def summarize(args: argparse.Namespace) -> None:
    records = [json.loads(line) for line in Path(args.records).read_text().splitlines() if line.strip()]
    errors = [r for r in records if "error" in r]
    records = [r for r in records if "error" not in r]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["config"], r["cell"]), []).append(r)
    print(
        f"{len(records)} jobs, {len(errors)} failed; take-off: first round with concept ARI >= {TAKE_OFF_ARI}"
    )
    last = f"acc r{args.rounds}"
    print(f"\nThe four take-off cells ({args.rounds} rounds, authors' recipe):")
    wide = max(map(len, CONFIGS)) + 2  # the config column
    print(f"{'config':<{wide}}{'cell':<6}{'runs':>5}{'take-offs':>10}{'median r':>9}{'acc r25':>8}"
          f"{last:>8}{'acc bestval':>12}{'final K':>8}{'dead':>5}")  # fmt: skip
    for config in (c for c in CONFIGS if not c.endswith("-k6")):  # K = 6: its own table below
        total, took = 0, []
        for cell in CELLS:
            runs = by.get((config, cell), [])
            if not runs:
                continue
            offs = [r["take_off"] for r in runs if r["take_off"] is not None]
            total += len(runs)
            took += offs
            print(
                f"{config:<{wide}}{cell:<6}{len(runs):>5}{len(offs):>10}{_median(offs):>9}"
                f"{_mean([r['acc25'] for r in runs]):>8}{_mean([r['acc_last'] for r in runs]):>8}"
                f"{_mean([r['acc_best_val'] for r in runs]):>12}"
                f"{statistics.mean(r['final_k'] for r in runs):>8.1f}{sum(r['dead'] > 0 for r in runs):>5}"
            )
        if total:
            median = _median(took + [args.rounds + 1] * (total - len(took)))
            final = {cell: _mean([r["acc_last"] for r in by.get((config, cell), [])]) for cell in MNIST_CELLS}
            print(
                f"{config:<{wide}}{'all':<6}{total:>5}{len(took):>10}  targets: "
                f"take-offs {len(took)}/{total} (>= 18 of 20), "
                f"median take-off {median} (<= 25; not taken off = {args.rounds + 1}), "
                f"mean r{args.rounds} accuracy m1 {final['m1']}, m10 {final['m10']} (>= 88 at r60)"
            )
    print("\nOne concept (m10-one): final K, accuracy (concept 0) at the last and best-validation round")
    fedavg = {r["seed"]: r for r in by.get(("fedavg", ONE_CONCEPT), [])}
    mechanisms = [(c, cell) for c, cell in by if cell == ONE_CONCEPT and c != "fedavg"]
    for r in sorted((r for key in mechanisms for r in by[key]), key=lambda r: (r["config"], r["seed"])):
        base = fedavg.get(r["seed"])
        versus = (
            ""
            if base is None
            else f"  FedAvg {100 * base['acc_last']:.1f} / {100 * base['acc_best_val']:.1f}"
        )
        close = None if base is None else r["acc_last"] >= base["acc_last"] - 0.01
        gap = "" if base is None else f"  at most 1 point below FedAvg: {close}"
        print(
            f"  {r['config']} seed {r['seed']}: final K {r['final_k']} (used {r['used']}), FedRC+mechanism "
            f"{100 * r['acc_last']:.1f} / {100 * r['acc_best_val']:.1f}{versus}{gap}"
        )
    print("\nThree concepts, K started at 6: final K, concept ARI, accuracy at the last round")
    six = [key for key in by if key[0].endswith("-k6")]
    for r in sorted((r for key in six for r in by[key]), key=lambda r: (r["config"], r["cell"], r["seed"])):
        print(
            f"  {r['config']} {r['cell']} seed {r['seed']}: final K {r['final_k']} (used {r['used']}, "
            f"dead {r['dead']}), "
            f"ARI {r['ari'][-1]:.2f}, acc {100 * r['acc_last']:.1f}"
        )
    seconds = [r["seconds"] for r in records]
    if seconds:
        spread = f"median {statistics.median(seconds):.0f}, max {max(seconds):.0f}"
        devices = sorted(
            {f"{r['device']} ({r.get('accelerator', 'accelerator not recorded')})" for r in records}
        )
        print(f"\njob seconds: {spread}; device {', '.join(devices)}")
    for r in records:
        if "fallback" in r:
            print(f"{r['name']}: {r['fallback']}")
    for r in errors:
        print(f"FAILED {r['name']}: {r['error'].strip().splitlines()[-1]}")


def print_configs(args: argparse.Namespace) -> None:
    """Every configuration as JSON: its strategy kind, the K it starts from and its FedRC options."""
    table = {
        name: {"kind": kind, "k_start": k, "options": options} for name, (kind, k, options) in CONFIGS.items()
    }
    print(json.dumps(table, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the jobs, one JSON line each")
    r.add_argument(
        "--data-root", required=True,
        help="folder holding a1, a10, m1, m10, m10-one (benchmarks/takeoff_data.py writes them)",
    )  # fmt: skip
    r.add_argument("--out", required=True, help="the JSON-lines file (appended; finished jobs are skipped)")
    r.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    r.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    r.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cores / workers)")
    r.add_argument("--rounds", type=int, default=60)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    r.add_argument("--precision", default="32-true")
    r.add_argument(
        "--executor", choices=("auto", "loop", "vectorized"), default="auto",
        help="the engine's executor (auto: the loop for a CNN; vectorized is ~2.5x faster on a GPU)",
    )  # fmt: skip
    r.add_argument("--eval-every", type=int, default=5, help="score the global clients every N rounds")
    r.add_argument("--only", nargs="+", default=None, help="keep jobs whose name contains one of these")
    r.add_argument("--max-jobs", type=int, default=None, help="the first N jobs in priority order")
    r.add_argument("--budget-s", type=float, default=None, help="stop (keeping finished jobs) after this")
    r.add_argument("--list", action="store_true", help="print the jobs and stop")
    s = sub.add_parser("summarize", help="print the table of a records file against the study's targets")
    s.add_argument("records")
    s.add_argument("--rounds", type=int, default=60)
    sub.add_parser("configs", help="print every configuration (kind, K at the start, FedRC options) as JSON")
    args = parser.parse_args()
    {"run": run, "summarize": summarize, "configs": print_configs}[args.command](args)


if __name__ == "__main__":
    main()
