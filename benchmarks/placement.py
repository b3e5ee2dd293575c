"""Which clients a take-off run places outside their concept's cluster, per seed.

Reads ``takeoff_runs.py`` records (JSON lines with each round's ``owners``, the clients' largest-ω
clusters) and the cell's ``manifest.json`` (each client's true concept). ``seeds`` prints one
markdown row per run, as in ``benchmarks/results/takeoff.md``: the concept ARI at rounds 15, 20,
25, 30 and the last; the take-off round (first ARI >= 0.8); how many rounds from 15 on have ARI
>= 0.8; the misplaced clients at round 20 and the last (``metrics.misplaced_clients``: concepts
matched one-to-one to clusters); the global accuracy (%) at rounds 25, 30, 40 and the last; the
best-validation round and its accuracy. ``scores`` asks whether a placement by likelihood would
do better: at each of ``--rounds``, the clients whose largest E-step score (the merge rule's
recorded ``cluster_scores``, mean −loss − log C per cluster; runs with merging only) is not their
concept's cluster, under that placement's own best matching. ``release`` screens a per-client
release of the grouping's hold without training: in each held round, a client's margin is its best
score under another cluster minus its score under its own (clusters that own a client only); a
release at margin m would free the clients whose margin exceeds m (in ``--in-a-row`` held rounds
in a row). It prints, per cell and m, how
many of the clients misplaced during the hold and how many placed right such a rule would free,
the chance that a misplaced client-round's margin exceeds a right one's (AUC; 0.5 is chance), and
the longest streak above the first margin (``longest_streak``: below ``group_release_rounds`` on
every run of a cell, the release frees nobody there and its runs are the hold's). ``ceiling``
reads the true-concept runs (``takeoff_runs.py``'s ``true``: every client trains its concept's
model from round 1): per run, the global accuracy with the clients' own E-step (``acc``) and with
their concept's model (``acc_true``), and the ARI of placing each client by its largest E-step
score under those models (where FedRC's E-step would pull it), with the clients so misplaced.

    python benchmarks/placement.py seeds RECORDS.jsonl --data-root /work/takeoff --only floor10/
    python benchmarks/placement.py scores RECORDS.jsonl --data-root /work/takeoff --rounds 20 25 30 60
    python benchmarks/placement.py release RECORDS.jsonl --data-root /work/takeoff --only hold30-k6/
    python benchmarks/placement.py ceiling RECORDS.jsonl --data-root /work/takeoff --only true/
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _takeoff import TAKE_OFF_ARI  # noqa: E402

from lightning_fedcluster.algorithms.discovery.release import release_margins  # noqa: E402
from lightning_fedcluster.metrics.clustering import grouping_ari, misplaced_clients  # noqa: E402

ARI_ROUNDS = (15, 20, 25, 30)
ACCURACY_ROUNDS = (25, 30, 40)


@functools.cache
def concepts_of(data_root: Path, cell: str) -> torch.Tensor:
    """The true concept of each client of a cell written by ``authors_comparison.py write`` (read
    once per cell; callers do not change it)."""
    manifest = json.loads((data_root / cell / "manifest.json").read_text())
    return torch.tensor([client["concept"] for client in manifest["clients"]])


def records(path: str, only: list[str]) -> list[dict[str, Any]]:
    """The finished records whose name contains one of ``only`` (all when empty), by name."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    kept = [r for r in rows if "error" not in r and (not only or any(word in r["name"] for word in only))]
    return sorted(kept, key=lambda r: (r["config"], r["cell"], r["seed"]))


def named(clients: torch.Tensor) -> str:
    return ",".join(map(str, clients.tolist())) or "–"


def seed_row(record: dict[str, Any], concept: torch.Tensor) -> str:
    """One markdown row: ARI, take-off, rounds at >= 0.8, misplaced clients, accuracy, best val."""
    ari, last = record["ari"], len(record["ari"])
    aris = " / ".join(f"{ari[r - 1]:.2f}" for r in (*ARI_ROUNDS, last) if r <= last)
    held = sum(a >= TAKE_OFF_ARI for a in ari[ARI_ROUNDS[0] - 1 :] if not math.isnan(a))
    counted = last - ARI_ROUNDS[0] + 1
    owners = record["owners"]
    misplaced = " / ".join(
        named(misplaced_clients(torch.tensor(owners[r - 1]), concept)) for r in (20, last) if r <= last
    )
    scored = record["scored"]
    accuracy = " / ".join(
        f"{100 * scored[str(r)]['acc']:.1f}" for r in (*ACCURACY_ROUNDS, last) if str(r) in scored
    )
    best = f"{record['best_val_round']}, {100 * record['acc_best_val']:.1f}"
    run = f"| {record['config']} | {record['cell']} | {record['seed']} |"
    off = record["take_off"] or "–"
    return f"{run} {aris} | {off} | {held} of {counted} | {misplaced} | {accuracy} | {best} |"


def seeds(args: argparse.Namespace) -> None:
    print(
        "| config | cell | seed | ARI r15 / r20 / r25 / r30 / last | take-off | rounds >= 0.8 from r15 | "
        "misplaced r20 / last | acc r25 / r30 / r40 / last | best val |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    concepts: dict[str, torch.Tensor] = {}
    for record in records(args.records, args.only):
        if "owners" not in record:  # the earliest take-off records keep only the ARI
            print(f"| {record['config']} | {record['cell']} | {record['seed']} | not recorded (no owners) |")
            continue
        cell = record["cell"]
        concepts.setdefault(cell, concepts_of(Path(args.data_root), cell))
        print(seed_row(record, concepts[cell]))


def scores(args: argparse.Namespace) -> None:
    header = " | ".join(f"r{r}: by ω / by score" for r in args.rounds)
    print(f"| config | cell | seed | {header} |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in args.rounds) + " |")
    concepts: dict[str, torch.Tensor] = {}
    for record in records(args.records, args.only):
        if "merge_scores" not in record or "owners" not in record:
            continue  # the scores are recorded only with merging on
        cell = record["cell"]
        concept = concepts.setdefault(cell, concepts_of(Path(args.data_root), cell))
        by_round = {row["round"]: row["scores"] for row in record["merge_scores"]}
        cells = []
        for r in args.rounds:
            if r not in by_round:
                cells.append("–")
                continue
            by_omega = misplaced_clients(torch.tensor(record["owners"][r - 1]), concept)
            by_score = misplaced_clients(torch.tensor(by_round[r]).argmax(1), concept)
            cells.append(f"{named(by_omega)} / {named(by_score)}")
        print(f"| {record['config']} | {cell} | {record['seed']} | " + " | ".join(cells) + " |")


def owned_margins(scores: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
    """The release's margins (``hold_release.release_margins``) of a round's clients from the
    record: each client's own cluster is its recorded owner, the targets the clusters some client
    owns (the alive ones in every held round of these records)."""
    owning = torch.zeros(scores.shape[1], dtype=torch.bool)
    owning[owners.unique()] = True
    own = torch.nn.functional.one_hot(owners, scores.shape[1]).to(torch.float64)
    return release_margins(scores, own, owning, owning)


def hold_margins(
    record: dict[str, Any], concept: torch.Tensor, in_a_row: int
) -> tuple[list[float], list[float], dict]:
    """The margins of every held round's client-rounds, misplaced and placed right, and per client
    its largest margin held for ``in_a_row`` rounds in a row (the largest over windows of the
    window's smallest) and whether it was ever misplaced in the rounds in which every
    grouped client is held, from the late pass's (or the grouping's) round + 1 to ``group_round`` +
    ``group_hold`` (1-based)."""
    options = record["options"]
    start = options.get("group_late_round") or options["group_round"]
    hold = options["group_round"] + options["group_hold"] - start
    by_round = {row["round"]: torch.tensor(row["scores"]) for row in record["merge_scores"]}
    wrong, right, history, misplaced_once = [], [], {}, set()
    for r in range(start + 1, start + hold + 1):
        owners = torch.tensor(record["owners"][r - 1])
        misplaced = set(misplaced_clients(owners, concept).tolist())
        for client, margin in enumerate(owned_margins(by_round[r], owners).tolist()):
            (wrong if client in misplaced else right).append(margin)
            history.setdefault(client, []).append(margin)
        misplaced_once |= misplaced
    largest = {
        client: (
            max(min(margins[i : i + in_a_row]) for i in range(len(margins) - in_a_row + 1)),
            client in misplaced_once,
        )
        for client, margins in history.items()
    }
    return wrong, right, largest


def longest_streak(record: dict[str, Any], margin: float) -> int:
    """The most held rounds in a row in which any client's margin exceeds ``margin``, over every
    round some client may be held (``group_round`` + 1 to the late pass's round + ``group_hold``,
    1-based), every client counted as held and the late pass's own round counted as above (the rule
    skips it): below ``group_release_rounds``, the rule releases nobody, so the run is the hold's."""
    options = record["options"]
    first, late = options["group_round"], options.get("group_late_round")
    last = (late or first) + options["group_hold"]
    by_round = {row["round"]: torch.tensor(row["scores"]) for row in record["merge_scores"]}
    longest, streaks = 0, {}
    for r in range(first + 1, last + 1):
        owners = torch.tensor(record["owners"][r - 1])
        for client, value in enumerate(owned_margins(by_round[r], owners).tolist()):
            above = r == late or value > margin
            streaks[client] = streaks.get(client, 0) + 1 if above else 0
            longest = max(longest, streaks[client])
    return longest


def release(args: argparse.Namespace) -> None:
    pooled: dict[str, list] = {}
    concepts: dict[str, torch.Tensor] = {}
    for record in records(args.records, args.only):
        if "merge_scores" not in record or not record["options"].get("group_hold"):
            continue  # the scores are recorded only with merging on; a release needs a hold
        cell = record["cell"]
        concept = concepts.setdefault(cell, concepts_of(Path(args.data_root), cell))
        entry = pooled.setdefault(cell, [[], [], [], 0, 0])
        entry[3] += 1
        entry[4] = max(entry[4], longest_streak(record, args.margins[0]))
        if concept.unique().numel() < 2:
            continue  # one concept: nobody is misplaced
        wrong, right, largest = hold_margins(record, concept, args.in_a_row)
        entry[0] += wrong
        entry[1] += right
        entry[2] += list(largest.values())
    header = " | ".join(f"m = {m}: misplaced / right freed" for m in args.margins)
    print(f"| cell | runs | AUC | {header} | longest streak above m = {args.margins[0]} |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in args.margins) + " | --- |")
    for cell, (wrong, right, largest, runs, longest) in sorted(pooled.items()):
        pairs = [(w > r) + 0.5 * (w == r) for w in wrong for r in right]
        auc = f"{sum(pairs) / len(pairs):.2f}" if pairs else "–"
        misplaced = [margin for margin, was_wrong in largest if was_wrong]
        placed = [margin for margin, was_wrong in largest if not was_wrong]
        freed = " | ".join(
            f"{sum(x > m for x in misplaced)} of {len(misplaced)} / "
            f"{sum(x > m for x in placed)} of {len(placed)}"
            for m in args.margins
        )
        print(f"| {cell} | {runs} | {auc} | {freed} | {longest} |")


def ceiling(args: argparse.Namespace) -> None:
    """One row per true-concept run, then each cell's means (see the module docstring)."""
    rounds = (*ARI_ROUNDS[1:], 45, 60)
    print(
        "| cell | seed | acc r60: own E-step / concept's model | best val (acc) | ARI by score "
        + " / ".join(f"r{r}" for r in rounds) + " | misplaced by score r60 | misplaced in every round 30-60 |"
    )  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    cells: dict[str, list[tuple[float, float, float]]] = {}
    for record in records(args.records, args.only):
        cell = record["cell"]
        concept = concepts_of(Path(args.data_root), cell)
        by_round = {row["round"]: torch.tensor(row["scores"]).argmax(1) for row in record["merge_scores"]}
        aris = [grouping_ari(concept, by_round[r]) for r in rounds]
        late = [set(misplaced_clients(by_round[r], concept).tolist()) for r in range(30, 61)]
        always = torch.tensor(sorted(set.intersection(*late)), dtype=torch.long)
        last = record["scored"]["60"]
        cells.setdefault(cell, []).append((last["acc"], last["acc_true"], aris[-1]))
        print(
            f"| {cell} | {record['seed']} | {100 * last['acc']:.1f} / {100 * last['acc_true']:.1f} | "
            f"{record['best_val_round']} ({100 * record['acc_best_val']:.1f}) | "
            + " / ".join(f"{a:.2f}" for a in aris)
            + f" | {named(misplaced_clients(by_round[60], concept))} | {named(always)} |"
        )
    print("\n| cell | runs | mean acc r60: own E-step / concept's model | ARI by score r60 >= 0.8 |")
    print("| --- | --- | --- | --- |")
    for cell, rows in sorted(cells.items()):
        acc, own = (100 * sum(r[i] for r in rows) / len(rows) for i in (0, 1))
        held = sum(r[2] >= TAKE_OFF_ARI for r in rows)
        print(f"| {cell} | {len(rows)} | {acc:.1f} / {own:.1f} | {held} of {len(rows)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    by_seed = sub.add_parser("seeds", help="one markdown row per run")
    by_score = sub.add_parser("scores", help="misplaced clients by largest ω and by largest E-step score")
    by_score.add_argument("--rounds", type=int, nargs="+", default=[20, 25, 30, 60])
    by_margin = sub.add_parser("release", help="would a per-client release of the hold free the misplaced")
    by_margin.add_argument("--margins", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    by_margin.add_argument("--in-a-row", type=int, default=1, help="rounds the margin must exceed m")
    by_ceiling = sub.add_parser("ceiling", help="the true-concept runs: accuracy and placement by score")
    for p in (by_seed, by_score, by_margin, by_ceiling):
        p.add_argument("records", help="takeoff_runs.py's JSON lines")
        p.add_argument("--data-root", required=True, help="authors_comparison.py write's directory")
        p.add_argument("--only", nargs="*", default=[], help="keep runs whose name contains a word")
    args = parser.parse_args()
    {"seeds": seeds, "scores": scores, "release": release, "ceiling": ceiling}[args.command](args)


if __name__ == "__main__":
    main()
