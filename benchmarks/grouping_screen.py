"""Concept grouping variants screened offline on recorded client signatures: which grouping
survives clients with corrupted images and clients that share few labels (issue 25).

Reads the signatures a ``TakeoffDiagnostics(keep_signatures=True)`` run recorded (``authors_comparison.py
run --diagnostics DIR``) and, for each listed round, groups the clients as ``group_round`` would
at that row (the grouping with ``group_round=T`` uses the signatures of round T's E-step, from the
models after round T − 1: the recording's row T − 1), with the library's own functions
(``algorithms/grouping.py``):

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

    python benchmarks/grouping_screen.py --rounds 10 14 \
        --run /work/takeoff/a1=/work/takeoff/diag/a1-g15/seed0.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from sklearn.metrics import adjusted_rand_score
from torch import Tensor

from lightning_fedcluster.algorithms.grouping import (
    confident,
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


if __name__ == "__main__":
    main()
