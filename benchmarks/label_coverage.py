"""How much of each concept's global test rows carries a label its clients never train on?

Under the authors' label skew (Dir(α · p) per client) a concept held by a few clients can miss a
label almost entirely; its cluster model is then never trained to predict that label, however well
the clients are grouped, and the concept's global client (clean images, the held-out pool) still
asks for it. Per take-off cell and concept this prints the labels with under ``--rare`` of the
concept's training rows, their share of those rows, and the share of the concept's global score
rows whose label is *not* rare (covered). The mean covered share times the accuracy a model reaches
on the labels it trained on estimates the global accuracy the cell allows.

    python benchmarks/label_coverage.py --data-root /work/takeoff
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from authors_comparison import read  # noqa: E402
from takeoff_configs import CELLS  # noqa: E402


def coverage(data: Path, rare: float) -> list[tuple[int, list[int], float, float]]:
    """Per concept: (concept, its rare labels, their share of its training rows, covered share of
    its global score rows)."""
    dm, global_clients, manifest = read(data)
    concept = torch.tensor([c["concept"] for c in manifest["clients"]])
    owner = torch.repeat_interleave(torch.arange(len(dm.train_sizes)), dm.train_sizes)
    rows = []
    for c, _, _, _, score_y in global_clients:
        labels = dm.train_y[concept[owner] == c]
        share = torch.bincount(labels, minlength=dm.num_classes).double() / labels.numel()
        is_rare = share < rare
        covered = float((~is_rare[score_y]).double().mean())
        rows.append((c, is_rare.nonzero().flatten().tolist(), float(share[is_rare].sum()), covered))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="authors_comparison.py write's directory")
    parser.add_argument("--rare", type=float, default=0.01, help="rare: under this share of the rows")
    args = parser.parse_args()
    print("| cell | concept | rare labels | their share of its training rows | score rows covered |")
    print("| --- | --- | --- | --- | --- |")
    for cell in CELLS:
        rows = coverage(Path(args.data_root) / cell, args.rare)
        for c, labels, share, covered in rows:
            print(f"| {cell} | {c} | {labels or '-'} | {100 * share:.1f} % | {100 * covered:.1f} % |")
        mean = sum(r[3] for r in rows) / len(rows)
        print(f"| {cell} | mean | | | **{100 * mean:.1f} %** |")


if __name__ == "__main__":
    main()
