"""Why concept grouping finds or misses the concepts: an offline study of the client signatures a
``TakeoffDiagnostics(keep_signatures=True)`` run recorded (``authors_comparison.py run
--diagnostics DIR`` writes them), on the data set ``authors_comparison.py write`` made.

Per listed round: the concept ARI of ω; the ARI of k-medoids groups (K = 3) of all clients'
signatures (what ``group_round`` would do at that round), of the clean clients alone, and of the
all-client grouping restricted to the clean and to the corrupted clients; the AUC with which a
signature distance tells a same-concept pair from a different-concept pair (P(d_same < d_diff),
all pairs sharing a label, and clean pairs); and how much the grouping follows the clients'
label histograms (ARI between the signature groups and k-medoids groups of the label histograms
by total variation). Then, at the last listed round, the AUC by pair type and by the number of
labels a pair shares. Last, two distance variants screened offline (not options of the library):
per-label distances weighted by the pair's smaller row count, and unknown pairs (no shared label)
set to the mean known distance instead of the largest.

``--held-from OTHER.json`` is a control for the label skew's share in a miss: it keeps, for each
client, only the labels the same client holds in another recorded run (e.g. the authors' skew's
data set), so the signatures of a per-class run are compared on as few labels as a skewed run's.

    python benchmarks/signature_study.py --data /work/takeoff/m1 \\
        --signatures /work/takeoff/diag/m1/seed0.json --rounds 1 5 10 14 15
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from sklearn.metrics import adjusted_rand_score
from torch import Tensor

from lightning_fedcluster.algorithms.signatures import k_medoids, signature_distances


def auc(same: Tensor, different: Tensor) -> float:
    """P(a same-concept distance < a different-concept distance), ties counted half."""
    if same.numel() == 0 or different.numel() == 0:
        return math.nan
    less = (same[:, None] < different[None, :]).double().mean()
    ties = (same[:, None] == different[None, :]).double().mean()
    return float(less + 0.5 * ties)


def variant_distances(means: Tensor, counts: Tensor, *, weighted: bool, fill_mean: bool) -> Tensor:
    """The library's centred-cosine signature distance, with per-label weights min(n_i, n_l)
    (``weighted``) and/or unknown pairs set to the mean known distance (``fill_mean``)."""
    held = counts >= 1
    common = held[:, None] & held[None]
    centred = means - means.mean(-1, keepdim=True)
    unit = centred / centred.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    per_label = 1 - (unit[:, None] * unit[None]).sum(-1)
    weights = common.double() * (torch.minimum(counts[:, None], counts[None]) if weighted else 1.0)
    total, mass = (per_label * weights).sum(-1), weights.sum(-1)
    distances = torch.where(mass > 0, total / mass.clamp_min(1e-12), torch.full_like(total, math.nan))
    distances.fill_diagonal_(0.0)
    if fill_mean:
        distances = torch.nan_to_num(distances, nan=float(distances[~distances.isnan()].mean()))
    return distances


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="the data set folder (its manifest.json)")
    parser.add_argument("--signatures", required=True, help="a diagnostics JSON with signatures kept")
    parser.add_argument("--rounds", type=int, nargs="+", required=True)
    parser.add_argument(
        "--held-from", default=None, help="keep only the labels each client holds in this diagnostics JSON"
    )
    args = parser.parse_args()
    manifest = json.loads((Path(args.data) / "manifest.json").read_text())
    concept = torch.tensor([c["concept"] for c in manifest["clients"]])
    clean = torch.tensor([c["feature_style"] == "clean" for c in manifest["clients"]])
    rows = {r["round"]: r for r in json.loads(Path(args.signatures).read_text())}
    missing = [r for r in args.rounds if r not in rows or "signatures" not in rows[r]]
    if missing:
        raise SystemExit(f"--rounds {missing}: not recorded with signatures in {args.signatures}")
    m = concept.numel()
    same = concept[:, None] == concept[None, :]
    off = ~torch.eye(m, dtype=torch.bool)
    both_clean = clean[:, None] & clean[None, :]
    both_corrupted = ~clean[:, None] & ~clean[None, :]

    def ari(groups: Tensor, mask: Tensor | None = None) -> float:
        truth = concept if mask is None else concept[mask]
        return float(adjusted_rand_score(truth.numpy(), groups.numpy()))

    keep = None
    if args.held_from is not None:
        other = json.loads(Path(args.held_from).read_text())[0]["signature_rows"]
        keep = torch.tensor(other, dtype=torch.float64) >= 1
        if keep.shape[0] != m:
            raise SystemExit(f"--held-from has {keep.shape[0]} clients, --data has {m}")

    def read_counts(row: dict) -> Tensor:
        counts = torch.tensor(row["signature_rows"], dtype=torch.float64)
        return counts if keep is None else counts * keep

    counts = read_counts(rows[args.rounds[0]])
    held = counts >= 1
    shared = (held[:, None] & held[None]).sum(-1)
    histogram = counts / counts.sum(1, keepdim=True)
    histogram_tv = 0.5 * (histogram[:, None] - histogram[None]).abs().sum(-1)
    histogram_groups = k_medoids(histogram_tv, 3)[0]
    print(
        f"{m} clients ({int(clean.sum())} clean, {int((~clean).sum())} corrupted); labels held per client: "
        f"median {float(held.sum(1).double().median()):.0f}, mean {float(held.sum(1).double().mean()):.2f}; "
        f"labels two clients share: median {float(shared[off].double().median()):.0f}; pairs sharing none: "
        f"{int((shared[off] == 0).sum()) // 2} of {m * (m - 1) // 2}"
    )
    print(f"label histograms alone (k-medoids, TV): ARI against the concepts {ari(histogram_groups):.2f}")
    print(
        f"{'round':>5} {'ARI(ω)':>7} {'sig all':>8} {'clean only':>11} {'all→clean':>10} {'all→corr':>9} "
        f"{'AUC':>5} {'AUC clean':>10} {'vs label hist':>14} {'weighted':>9} {'NaN→mean':>9}"
    )
    for number in args.rounds:
        row = rows[number]
        means = torch.tensor(row["signatures"], dtype=torch.float64)
        counts = read_counts(row)
        distances, known = signature_distances(means, counts)
        known = known & off
        groups = k_medoids(distances, 3)[0]
        clean_groups = k_medoids(distances[clean][:, clean], 3)[0]
        weighted = k_medoids(variant_distances(means, counts, weighted=True, fill_mean=False), 3)[0]
        filled = k_medoids(variant_distances(means, counts, weighted=False, fill_mean=True), 3)[0]
        print(
            f"{number:>5} {row['ari']:>7.2f} {ari(groups):>8.2f} {ari(clean_groups, clean):>11.2f} "
            f"{ari(groups[clean], clean):>10.2f} {ari(groups[~clean], ~clean):>9.2f} "
            f"{auc(distances[known & same], distances[known & ~same]):>5.2f} "
            f"{auc(distances[known & same & both_clean], distances[known & ~same & both_clean]):>10.2f} "
            f"{adjusted_rand_score(histogram_groups.numpy(), groups.numpy()):>14.2f} "
            f"{ari(weighted):>9.2f} {ari(filled):>9.2f}"
        )
    print(f"round {number}, by pair: AUC, mean distance same / different concept")
    for name, mask in (
        ("clean-clean", both_clean),
        ("clean-corrupted", ~both_clean & ~both_corrupted),
        ("corrupted-corrupted", both_corrupted),
    ):
        a, b = distances[known & same & mask], distances[known & ~same & mask]
        print(f"  {name:<20} AUC {auc(a, b):.2f}  distance {float(a.mean()):.3f} / {float(b.mean()):.3f}")
    for low, high in ((1, 1), (2, 2), (3, 4), (5, 10)):
        mask = (shared >= low) & (shared <= high)
        a, b = distances[known & same & mask], distances[known & ~same & mask]
        print(f"  sharing {low}-{high} labels: {int((mask & off).sum()) // 2:>3} pairs, AUC {auc(a, b):.2f}")


if __name__ == "__main__":
    main()
