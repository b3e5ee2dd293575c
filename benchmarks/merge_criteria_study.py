"""Which merge criterion separates a concept split over two clusters from two concepts?

``takeoff_runs.py`` keeps, for runs with merging on, each round's merge scores s_ik (client i's
mean E-step score under cluster k: −loss − log C_{y,k}), every client's largest-ω cluster and
log C. This script replays them offline and, per round, looks at every pair of clusters that both
own a client: the pair is *same-concept* when the clients of both clusters are mostly of one
concept, *different* otherwise. For each criterion it prints the largest same-concept value and
the smallest different-concept value over the pairs of that round; a criterion separates the
round when the first is below the second (a threshold between them merges only the duplicates).

Criteria (all N_i-weighted means over the members of the pair, as ``merging.pair_gaps``):

    gap        |s_ik − s_il| (the library's ``merge_threshold`` rule)
    loss_gap   |ℓ_ik − ℓ_il| with ℓ the mean cross-entropy alone (the label prior term removed:
               clusters fitted to different label mixes of one concept differ in it)
    ratio      loss_gap divided by the members' mean own-cluster cross-entropy (scale-free)

    python benchmarks/merge_criteria_study.py --data-root /work/takeoff RECORDS.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from authors_comparison import read  # noqa: E402

CRITERIA = ("gap", "loss_gap", "ratio")


def label_shares(dm) -> torch.Tensor:  # noqa: ANN001
    """Each client's training label frequencies [M, C]."""
    shares = torch.zeros(len(dm.train_sizes), dm.num_classes, dtype=torch.float64)
    owner = torch.repeat_interleave(torch.arange(len(dm.train_sizes)), dm.train_sizes)
    shares.index_put_((owner, dm.train_y), torch.ones(owner.numel(), dtype=torch.float64), accumulate=True)
    return shares / shares.sum(1, keepdim=True)


def weighted_mean(values: torch.Tensor, members: torch.Tensor, sizes: torch.Tensor) -> float:
    """The N_i-weighted mean of ``values`` [M] over ``members``."""
    w = sizes[members].to(torch.float64)
    return float((w * values[members]).sum() / w.sum())


def pair_values(
    scores: torch.Tensor, log_c: torch.Tensor, owner: torch.Tensor, shares: torch.Tensor, sizes: torch.Tensor
) -> dict[tuple[int, int], dict[str, float]]:
    """Every criterion for every pair of clusters that both own a client."""
    prior = shares @ log_c  # [M, K]: mean_j log C_{y_j,k}
    loss = -(scores + prior)  # mean cross-entropy per client and cluster
    out = {}
    owned = sorted(set(owner.tolist()))
    for a, k in enumerate(owned):
        for m in owned[a + 1 :]:
            members = (owner == k) | (owner == m)
            own = torch.where(owner == k, loss[:, k], loss[:, m])
            loss_gap = weighted_mean((loss[:, k] - loss[:, m]).abs(), members, sizes)
            out[(k, m)] = {
                "gap": weighted_mean((scores[:, k] - scores[:, m]).abs(), members, sizes),
                "loss_gap": loss_gap,
                "ratio": loss_gap / max(weighted_mean(own, members, sizes), 1e-6),
            }
    return out


def same_concept(owner: torch.Tensor, concept: torch.Tensor, k: int, m: int) -> bool:
    """Whether the majority concepts of the two clusters' clients are one."""
    major = [int(concept[owner == c].mode().values) for c in (k, m)]
    return major[0] == major[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+")
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, nargs="*", default=[20, 25, 30, 35, 40, 45, 50, 55, 60])
    args = parser.parse_args()
    cache = {}
    for path in args.records:
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            if "merge_scores" not in record:
                continue
            cell = record["cell"]
            if cell not in cache:
                dm, _, manifest = read(Path(args.data_root) / cell)
                concept = torch.tensor([c["concept"] for c in manifest["clients"]])
                cache[cell] = (label_shares(dm), dm.train_sizes, concept)
            shares, sizes, concept = cache[cell]
            print(f"\n{record['name']} (K from {record['k_start']})")
            print("round  pairs same/diff  " + "  ".join(f"{c:>8} same max / diff min" for c in CRITERIA))
            for row in record["merge_scores"]:
                if row["round"] not in args.rounds:
                    continue
                # records written before 2026-11-26 17:00 keep the owners in the merge rows
                owner = torch.tensor(row["owner"] if "owner" in row else record["owners"][row["round"] - 1])
                values = pair_values(
                    torch.tensor(row["scores"], dtype=torch.float64),
                    torch.tensor(row["log_c"], dtype=torch.float64),
                    owner,
                    shares,
                    sizes,
                )
                same = [v for (k, m), v in values.items() if same_concept(owner, concept, k, m)]
                diff = [v for (k, m), v in values.items() if not same_concept(owner, concept, k, m)]
                cells = []
                for c in CRITERIA:
                    top = f"{max(v[c] for v in same):.3f}" if same else "-"
                    low = f"{min(v[c] for v in diff):.3f}" if diff else "-"
                    cells.append(f"{top:>17} / {low:<8}")
                print(f"{row['round']:>5}  {len(same):>5}/{len(diff):<4}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
