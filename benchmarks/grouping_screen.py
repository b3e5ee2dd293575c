"""Concept grouping variants screened offline on recorded client signatures: which grouping
survives clients with corrupted images and clients that share few labels (the take-off study).

Reads the signatures a ``TakeoffDiagnostics(keep_signatures=True)`` run recorded (``authors_comparison.py
run --diagnostics DIR``) and, for each listed round, groups the clients as ``group_round`` would
at that row (the grouping with ``group_round=T`` uses the signatures of round T's E-step, from the
models after round T − 1: the recording's row T − 1), with the library's own functions
(``algorithms/discovery/grouping.py``):

- ``medoid``: k-medoids of all clients (the library's default grouping);
- ``mean``: k-medoids refined by the mean distance to each group's members, weighted by the labels a
  pair shares (``group_assign="mean"``);
- ``... m<x>``: only the clients whose best group score is below x × the second best are grouped
  (``group_margin=x``); the others would get uniform ω;

and, as variants that are not options of the library: pairs sharing fewer than two labels
treated as unknown (distance: the mean known distance), and distances averaged over every
recorded round up to the listed one.

Each cell: the ARI of the grouped clients' groups against their concepts, then how many clients
were grouped / of them clean (25 / 15 = all). Recordings and commands: ``benchmarks/results/takeoff.md``.

With ``--late L ...``: the late pass (``group_late_round``) on top of ``mean m0.7`` at each listed
round: the clients the margin left out are placed by the signatures of row L
(``group_scores.late_clusters``, the grouped clients voting with their groups). Printed: the ARI of all
clients, and how many of the left-out clients went to their concept's group (the group most of
the concept's grouped clients are in). The rows after a recording's grouping come from its own
run (another grouping or none), so this is a proxy for a run with the late pass.

    python benchmarks/grouping_screen.py --rounds 10 14 \
        --run /work/takeoff/a1=/work/takeoff/diag/a1-g15/seed0.json

``--groups 6 --show-groups`` shows what a run started at K = 6 groups into (``mean``: the groups
left after the refinement, which can be fewer than K).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from sklearn.metrics import adjusted_rand_score
from torch import Tensor

from lightning_fedcluster.algorithms.group_scores import (
    confident,
    late_clusters,
    mean_distance_groups,
    mean_scores,
    medoid_scores,
)
from lightning_fedcluster.algorithms.signatures import k_medoids, signature_distances

MARGINS = (0.7, 0.8)


def cell(groups: Tensor, mask: Tensor, concept: Tensor, clean: Tensor) -> str:
    """ARI of the masked clients' groups, then grouped / clean grouped."""
    count = f"{int(mask.sum())}/{int((mask & clean).sum())}"
    if int(mask.sum()) < 2:
        return f"   -  {count:>5}"
    ari = adjusted_rand_score(concept[mask].numpy(), groups[mask].numpy())
    return f"{ari:5.2f} {count:>5}"


def variants(
    means: Tensor, counts: Tensor, history: list[Tensor], k: int
) -> dict[str, tuple[Tensor, Tensor]]:
    """Each variant's groups [M] and the mask [M] of the clients it groups."""
    everyone = torch.ones(means.shape[0], dtype=torch.bool)
    distances, _ = signature_distances(means, counts)
    held = (counts >= 1).to(torch.float64)
    shared = held @ held.T
    medoid = k_medoids(distances, k)[0]
    mean = mean_distance_groups(distances, shared, medoid)
    out = {"medoid": (medoid, everyone), "mean": (mean, everyone)}
    for margin in MARGINS:
        out[f"medoid m{margin}"] = (medoid, confident(medoid_scores(distances, medoid), margin))
        out[f"mean m{margin}"] = (mean, confident(mean_scores(distances, shared, mean), margin))
    sparse = distances.clone()
    sparse[(shared < 2) & ~torch.eye(shared.shape[0], dtype=torch.bool)] = torch.nan
    known = sparse[~sparse.isnan()]
    out["min 2 shared"] = (k_medoids(torch.nan_to_num(sparse, nan=float(known.mean())), k)[0], everyone)
    out["rounds averaged"] = (k_medoids(torch.stack(history).mean(0), k)[0], everyone)
    return out


def late_pass(rows: dict[int, dict], round_: int, lates: list[int], concept: Tensor, k: int) -> list[str]:
    """``mean m0.7`` at ``round_``, then the late pass with each row of ``lates``: one line each."""
    means, counts = (
        torch.tensor(rows[round_][key], dtype=torch.float64) for key in ("signatures", "signature_rows")
    )
    distances, _ = signature_distances(means, counts)
    held = (counts >= 1).to(torch.float64)
    groups = mean_distance_groups(distances, held @ held.T, k_medoids(distances, k)[0])
    sure = confident(mean_scores(distances, held @ held.T, groups), 0.7)
    home = {c: int(torch.bincount(groups[sure & (concept == c)], minlength=k).argmax()) for c in range(k)}
    waiting = (~sure).nonzero().flatten()
    lines = []
    for late in lates:
        if late not in rows:
            continue
        means, counts = (
            torch.tensor(rows[late][key], dtype=torch.float64) for key in ("signatures", "signature_rows")
        )
        d, _ = signature_distances(means, counts)
        h = (counts >= 1).to(torch.float64)
        omega = torch.nn.functional.one_hot(groups, k).to(torch.float64)
        placed = late_clusters(d, h @ h.T, omega, torch.ones(k, dtype=torch.bool), sure)
        final = torch.where(sure, groups, placed)
        right = sum(int(placed[i]) == home[int(concept[i])] for i in waiting.tolist())
        ari = adjusted_rand_score(concept.numpy(), final.numpy())
        lines.append(
            f"  grouped at {round_}, late pass with row {late:>2}: ARI {ari:5.2f}, "
            f"left-out clients placed right {right}/{waiting.numel()}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        help="DATA=SIGNATURES: a data set folder and a diagnostics JSON",
    )
    parser.add_argument("--rounds", type=int, nargs="+", required=True)
    parser.add_argument("--groups", type=int, default=3, help="K (alive clusters)")
    parser.add_argument("--late", type=int, nargs="*", default=[], help="rows for the late pass")
    parser.add_argument(
        "--show-groups",
        action="store_true",
        help="print the groups of the `mean` variant: each member as client:concept:style",
    )
    args = parser.parse_args()
    header = None
    for spec in args.run:
        data, _, path = spec.partition("=")
        manifest = json.loads((Path(data) / "manifest.json").read_text())
        concept = torch.tensor([c["concept"] for c in manifest["clients"]])
        clean = torch.tensor([c["feature_style"] == "clean" for c in manifest["clients"]])
        rows = {r["round"]: r for r in json.loads(Path(path).read_text()) if "signatures" in r}
        history: list[Tensor] = []
        for number in sorted(rows):
            if number > max(args.rounds):
                break
            row = rows[number]
            means = torch.tensor(row["signatures"], dtype=torch.float64)
            counts = torch.tensor(row["signature_rows"], dtype=torch.float64)
            history.append(signature_distances(means, counts)[0])
            if number not in args.rounds:
                continue
            result = variants(means, counts, history, args.groups)
            if header is None:
                header = f"{'recording':<28} {'round':>5} " + " ".join(f"{name:>17}" for name in result)
                print(header)
            name = f"{Path(data).name} {Path(path).parent.name}/{Path(path).stem}"
            print(
                f"{name:<28} {number:>5} "
                + " ".join(f"{cell(g, m, concept, clean):>17}" for g, m in result.values())
            )
            for line in late_pass(rows, number, args.late, concept, args.groups):
                print(line)
            if args.show_groups:
                styles = [c["feature_style"] for c in manifest["clients"]]
                groups = result["mean"][0]
                for g in range(int(groups.max()) + 1):
                    members = (groups == g).nonzero().flatten().tolist()
                    listed = " ".join(f"{i}:{int(concept[i])}:{styles[i]}" for i in members)
                    print(f"  group {g} ({len(members)} clients): {listed}")


if __name__ == "__main__":
    main()
