"""The figure of the docs page "How clusters form", from ``TakeoffDiagnostics`` records.

Each ``--run LABEL=PATH`` is a JSON written by ``TakeoffDiagnostics`` (``authors_comparison.py run
--diagnostics DIR`` writes DIR/seed<s>.json). Six panels per round: the concept ARI of the
clients' ω and of k-medoids groups of their prediction signatures; the median E-step margin; the
smallest prediction distance between two cluster models; the mean entropy of γ; how much of each
concept's data its largest cluster explains; the largest cluster's share of the data (a cluster
that wins every concept shows here).

    python benchmarks/takeoff_figure.py --run "seed 4 (takes off)=/work/takeoff/diag/m10/seed4.json" \\
        --run "seed 1 (does not)=/work/takeoff/diag/m10/seed1.json" --out docs/figures/how-clusters-form.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(rows: list[dict], key: str) -> list[float]:
    return [float(row[key]) if row.get(key) is not None else math.nan for row in rows]


def purity(row: dict) -> float:
    """Mean over concepts of the share of the concept's data its largest cluster explains."""
    shares = row["shares"]
    return sum(max(concept) for concept in shares) / len(shares)


def largest_cluster(row: dict) -> float:
    """The largest cluster's share, averaged over the concepts (1/K: balanced; 1: one cluster)."""
    shares = row["shares"]
    return max(sum(concept[k] for concept in shares) / len(shares) for k in range(len(shares[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="LABEL=PATH of a diagnostics JSON")
    parser.add_argument("--out", default="docs/figures/how-clusters-form.png", help="the PNG to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    runs = []
    for spec in args.run:
        label, path = spec.split("=", 1)
        runs.append((label, json.loads(Path(path).read_text())))
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), constrained_layout=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (label, rows), colour in zip(runs, colours, strict=False):
        rounds = [row["round"] for row in rows]
        ax = axes[0, 0]
        ax.plot(rounds, series(rows, "ari"), color=colour, label=f"{label}: ω")
        ax.plot(rounds, series(rows, "prediction_ari"), color=colour, ls="--", label=f"{label}: signatures")
        axes[0, 1].plot(rounds, series(rows, "margin_median"), color=colour, label=label)
        axes[0, 2].plot(rounds, series(rows, "model_tv_min"), color=colour, label=label)
        axes[1, 0].plot(rounds, series(rows, "gamma_entropy_mean"), color=colour, label=label)
        axes[1, 1].plot(rounds, [purity(row) for row in rows], color=colour, label=label)
        axes[1, 2].plot(rounds, [largest_cluster(row) for row in rows], color=colour, label=label)
    k = len(runs[0][1][0]["shares"][0])
    axes[0, 0].axhline(0.8, color="grey", lw=0.8, ls=":")
    axes[0, 0].set(title="concept ARI (dashed: signature groups)", ylim=(-0.1, 1.05))
    axes[0, 1].set(title="E-step margin, median client (nats)", yscale="log")
    axes[0, 2].set(title="closest two models (TV of predictions)")
    axes[1, 0].axhline(math.log(k), color="grey", lw=0.8, ls=":")
    axes[1, 0].set(title=f"mean entropy of γ (log K = {math.log(k):.2f})")
    axes[1, 1].set(title="concept share in its largest cluster", ylim=(0, 1.02))
    axes[1, 2].axhline(1 / k, color="grey", lw=0.8, ls=":")
    axes[1, 2].set(title="largest cluster's share (mean over concepts)", ylim=(0, 1.02))
    for ax in axes.flat:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    axes[0, 1].legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
