"""How soon FedRC separates the concepts across seeds, the authors' code against
this library, each side with its own randomness (initial weights, minibatch shuffles).

The differential trace (``authors_trace.py``) shows that the two compute the same round from the
same weights and minibatches. This script asks the question that remains: over independent seeds,
does one side take off (concept ARI >= 0.8) later or less often than the other? Both sides train
on the same clients (a scenario written by ``authors_comparison.py write``) with the authors'
FashionMNIST-C recipe (FashionCNN, SGD lr 0.06, momentum 0.9 kept per client and cluster, weight
decay 5e-4, batch 128, one local step, every client every round, K = 3).

    authors    their unmodified ``run_experiment`` (``_authors_side.py`` with ``native``), one child
               process per seed: their seeded initial weights, their shuffled training loader, no
               per-round evaluation; ω and log C are recorded every round, the cluster weights at
               --score-rounds. Needs a checkout of LINs-lab/FedRC outside this repository.
    summarize  the table: per side and seed, the first round whose concept ARI (argmax ω of the
               training clients against their concepts) is >= 0.8, and the global accuracy per
               concept at the score rounds (ω of each global client fitted on its adapt rows by
               the library's rule, accuracy on its score rows; the same rule for both sides'
               weights). The library's rows are read from the output of
               ``authors_comparison.py run`` (ARI printed with two decimals).

    python benchmarks/authors_comparison.py write --out /tmp/a1 --clients 25 --train 160 --test 40 \\
        --concepts 3 --seed 0
    OMP_NUM_THREADS=1 python benchmarks/authors_comparison.py run --data /tmp/a1 --rounds 60 \\
        --optimizer-state persist --seeds 0 1 2 3 4 > /tmp/a1-library.log
    OMP_NUM_THREADS=1 python benchmarks/authors_takeoff.py authors --data /tmp/a1 --authors /work/authors \\
        --out /tmp/a1-authors --rounds 60 --seeds 1234 1235 1236 1237 1238
    python benchmarks/authors_takeoff.py summarize --data /tmp/a1 --library-log /tmp/a1-library.log \\
        --out /tmp/a1-authors
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from _takeoff import TAKE_OFF_ARI, take_off_round

ROW = re.compile(r"^(\d+)\s+" + r"\s+".join([r"(-?[\d.]+|nan)"] * 8) + r"\s*$")
SEED = re.compile(r"^seed (\d+): ")


def run_authors(args: argparse.Namespace) -> None:
    """One child process per seed: their modules use top-level names (``utils``, ``models``)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        command = [
            sys.executable, __file__, "_one", "--data", args.data, "--authors", args.authors,
            "--out", args.out, "--rounds", str(args.rounds), "--seeds", str(seed),
            "--score-rounds", *map(str, args.score_rounds),
        ] + (["--shared-batches"] if args.shared_batches else [])  # fmt: skip
        subprocess.run(command, check=True)


def run_one(args: argparse.Namespace) -> None:
    from _authors_side import authors_side

    torch.set_num_threads(1)
    native = argparse.Namespace(
        data=args.data, out=args.out, authors=args.authors, rounds=args.rounds, algorithm="fedrc",
        authors_seed=args.seeds[0], seed=args.seeds[0], native=True, keep_weights=args.score_rounds,
        shared_batches=args.shared_batches,
    )  # fmt: skip
    authors_side(native)


def take_off(aris: list[float], threshold: float = TAKE_OFF_ARI) -> int | None:
    """The first round (1-based) whose ARI is >= ``threshold``, or None."""
    return take_off_round(enumerate(aris, start=1), threshold)


def library_runs(log: Path, concepts: int) -> dict[int, dict[str, Any]]:
    """Per seed: ARI every round, accuracy per concept every round, train CPU-s, peak MB."""
    runs: dict[int, dict[str, Any]] = {}
    seed = None
    for line in log.read_text().splitlines():
        if match := SEED.match(line):
            seed = int(match.group(1))
            runs[seed] = {"ari": [], "acc": [], "cpu_s": [], "peak_mb": 0.0}
            continue
        match = ROW.match(line)
        if match and seed is not None:
            values = [float(v) for v in match.groups()[1:]]
            run = runs[seed]
            run["acc"].append([v / 100 for v in values[:concepts]])
            run["ari"].append(values[concepts + 1])
            run["cpu_s"].append(values[concepts + 2])
            run["peak_mb"] = max(run["peak_mb"], values[concepts + 4])
    return runs


def authors_runs(out: Path, data: Path, score_rounds: list[int]) -> dict[int, dict[str, Any]]:
    if not any(out.glob("authors-seed*.pt")):
        return {}
    from authors_comparison import read
    from authors_trace import Scorer

    from lightning_fedcluster.metrics import concept_ari

    _, _, manifest = read(data)
    concept = torch.tensor([c["concept"] for c in manifest["clients"]])
    scorer = Scorer(data, "fedrc")
    runs = {}
    for path in sorted(out.glob("authors-seed*.pt")):
        record = torch.load(path)
        rounds = record["rounds"]
        acc: list[list[float] | None] = [None] * len(rounds)
        for t in score_rounds:
            if t <= len(rounds) and "weights" in rounds[t - 1]:
                outputs = scorer.outputs(rounds[t - 1]["weights"])
                acc[t - 1] = scorer.accuracy(outputs, scorer.library_rule(outputs, rounds[t - 1]["log_c"]))
        runs[int(record["seed"])] = {
            "ari": [concept_ari(r["omega"], concept) for r in rounds],
            "acc": acc,
            "cpu_s": [r["cpu_s"] for r in rounds],
        }
    return runs


def summarize(args: argparse.Namespace) -> None:
    from _common import machine_line, set_clock

    set_clock("cpu")  # both sides' rounds were timed with time.process_time
    sides = {
        "library": library_runs(Path(args.library_log), args.concepts),
        "authors": authors_runs(Path(args.out), Path(args.data), args.score_rounds),
    }
    print(machine_line())
    print(f"take-off: first round with concept ARI >= {TAKE_OFF_ARI}; accuracy: mean (per concept)")
    table: dict[str, Any] = {}
    for side, runs in sides.items():
        if not runs:  # e.g. a library-only study: no authors' records in --out
            continue
        rows = []
        for seed, run in sorted(runs.items()):
            row = {"seed": seed, "rounds": len(run["ari"]), "take_off": take_off(run["ari"])}
            row["half_way"] = take_off(run["ari"], 0.5)  # a softer mark: the first ARI >= 0.5
            row["max_ari"] = max(run["ari"])
            for t in args.score_rounds:
                scores = run["acc"][t - 1] if t <= len(run["acc"]) else None
                if scores is not None and any(s != s for s in scores):  # not scored (--eval-every)
                    scores = None
                row[f"acc{t}"] = scores
                row[f"ari{t}"] = run["ari"][t - 1] if t <= len(run["ari"]) else None
            row["cpu_s"] = statistics.median(run["cpu_s"])
            rows.append(row)
            cells = [f"{side:<8} seed {seed:<5}", f"take-off {row['take_off'] or 'never':>5}"]
            cells.append(f"ARI>=0.5 {row['half_way'] or 'never':>5}  max ARI {row['max_ari']:.2f}")
            for t in args.score_rounds:
                scores = row[f"acc{t}"]
                if scores is not None:
                    per = "/".join(f"{100 * s:.1f}" for s in scores)
                    mean = 100 * statistics.mean(scores)
                    cells.append(f"r{t}: {mean:5.1f} ({per}) ARI {row[f'ari{t}']:.2f}")
            cells.append(f"{row['cpu_s']:.1f} CPU-s/round")
            print("  ".join(cells))
        reached = [r["take_off"] for r in rows if r["take_off"] is not None]
        line = f"{side:<8} {len(reached)}/{len(rows)} seeds take off"
        if reached:
            line += f", rounds {sorted(reached)}, median {statistics.median(reached):g}"
        line += f"; {sum(r['half_way'] is not None for r in rows)}/{len(rows)} reach ARI 0.5"
        line += f"; max ARI median {statistics.median(r['max_ari'] for r in rows):.2f}"
        for t in args.score_rounds:
            means = [statistics.mean(r[f"acc{t}"]) for r in rows if r[f"acc{t}"] is not None]
            if len(means) > 1:
                line += f"; r{t} acc {100 * statistics.mean(means):.1f} ± {100 * statistics.stdev(means):.1f}"
        print(line)
        table[side] = rows
    Path(args.out, "takeoff.json").write_text(json.dumps(table, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("authors", "summarize", "_one"))
    parser.add_argument("--data", required=True, help="a scenario written by authors_comparison.py write")
    parser.add_argument("--authors", help="a checkout of LINs-lab/FedRC (outside this repository)")
    parser.add_argument("--out", required=True, help="folder of the authors' records (authors-seed*.pt)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234, 1235, 1236, 1237, 1238])
    parser.add_argument("--score-rounds", type=int, nargs="+", default=[25, 60])
    parser.add_argument("--library-log", help="summarize: the output of authors_comparison.py run")
    parser.add_argument("--concepts", type=int, default=3)
    parser.add_argument(
        "--shared-batches", action="store_true",
        help="authors: all K learners of a client take the same minibatches in a round (the library's way)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.command in ("authors", "_one") and not args.authors:
        parser.error("--authors DIR is needed to run the authors' side")
    if args.command == "summarize" and not args.library_log:
        parser.error("summarize needs --library-log (the output of authors_comparison.py run)")
    {"authors": run_authors, "_one": run_one, "summarize": summarize}[args.command](args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
