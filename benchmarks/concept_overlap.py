"""Which clients of a take-off cell could another concept have labelled the same way?

A concept is a label permutation (FedRC App. H.8): concept 1 maps class y to C-1-y, concept 2 to
y+1 mod C. Two such maps can agree on some classes (for C = 10, concepts 1 and 2 both give class 4
the label 5 and class 9 the label 0). Under the authors' label skew a client holds a few classes, so
a client of one concept can hold mostly rows that another concept labels identically: its data is
then (almost) equally well explained by both concepts, and no clustering can be asked to place it
by concept. ``table`` prints, per client, the share of its training rows each concept's map labels
as the client's does; ``rescore`` recomputes a ``takeoff_runs.py`` record's concept ARI per round
on the clients whose share under every other concept is at most ``--ambiguous`` (a diagnostic
beside the take-off runs' ARI over all clients, not a replacement).

    python benchmarks/concept_overlap.py table --data-root /work/takeoff
    python benchmarks/concept_overlap.py rescore RECORDS.jsonl --data-root /work/takeoff
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _takeoff import take_off_round  # noqa: E402
from authors_comparison import read  # noqa: E402
from takeoff_configs import CELLS  # noqa: E402

from lightning_fedcluster.datamodules.shifts import labelled_alike  # noqa: E402
from lightning_fedcluster.metrics.clustering import grouping_ari  # noqa: E402


def overlap(data: Path) -> tuple[list[dict], torch.Tensor]:
    """The cell's manifest clients and [clients, concepts]: the share of each client's training
    rows that each concept's label map labels as the client's own concept does."""
    dm, _, manifest = read(data)
    clients = manifest["clients"]
    concepts = max(c["concept"] for c in clients) + 1
    owner = torch.repeat_interleave(torch.arange(len(clients)), dm.train_sizes)
    rows = [
        labelled_alike(dm.train_y[owner == i], client["concept"], concepts, dm.num_classes)
        for i, client in enumerate(clients)
    ]
    return clients, torch.stack(rows)


def other_share(clients: list[dict], shares: torch.Tensor) -> torch.Tensor:
    """Per client: the largest share under a concept other than its own."""
    own = torch.tensor([c["concept"] for c in clients])
    masked = shares.clone()
    masked[torch.arange(len(clients)), own] = -1.0
    return masked.max(dim=1).values


def table(args: argparse.Namespace) -> None:
    for cell in CELLS:
        clients, shares = overlap(Path(args.data_root) / cell)
        other = other_share(clients, shares)
        share = f"{args.ambiguous:.0%}"
        print(f"{cell}: clients with over {share} of their rows labelled alike by another concept")
        print("| client | concept | images | share labelled alike by concept 0 / 1 / 2 ... |")
        print("| --- | --- | --- | --- |")
        for i in (other > args.ambiguous).nonzero().flatten().tolist():
            alike = " / ".join(f"{v:.2f}" for v in shares[i].tolist())
            print(f"| {i} | {clients[i]['concept']} | {clients[i]['feature_style']} | {alike} |")
        print()


def rescore(args: argparse.Namespace) -> None:
    kept: dict[str, torch.Tensor] = {}
    truth: dict[str, torch.Tensor] = {}
    share = f"{args.ambiguous:.0%}"
    print(f"| run | ARI, all clients: last round / take-off | without clients over {share} alike (which): "
          "last round / take-off |")
    print("| --- | --- | --- |")
    for line in Path(args.records).read_text().splitlines():
        record = json.loads(line)
        if record.get("error") or len(record.get("concepts", [])) < 2:
            continue
        cell = record["cell"]
        if cell not in kept:
            clients, shares = overlap(Path(args.data_root) / cell)
            kept[cell] = other_share(clients, shares) <= args.ambiguous
            truth[cell] = torch.tensor([c["concept"] for c in clients])
        mask = kept[cell]
        if "owners" not in record:  # the earliest take-off records keep only the ARI
            last = f"{record['ari'][-1]:.2f} / {record['take_off']}"
            print(f"| {record['name']} | {last} | not recorded (no owners) |")
            continue
        aris = [grouping_ari(truth[cell][mask], torch.tensor(o)[mask]) for o in record["owners"]]
        rounds = list(range(1, len(aris) + 1))
        off = take_off_round(zip(rounds, aris, strict=True))
        left_out = (~mask).nonzero().flatten().tolist()
        full = [a for a in record["ari"] if not math.isnan(a)]
        print(
            f"| {record['name']} | {full[-1]:.2f} / {record['take_off']} | "
            f"({', '.join(map(str, left_out))}): {aris[-1]:.2f} / {off} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="the clients another concept labels (mostly) alike, per cell")
    r = sub.add_parser("rescore", help="a take-off record's concept ARI without those clients")
    r.add_argument("records", help="takeoff_runs.py's JSON lines")
    for p in (t, r):
        p.add_argument("--data-root", required=True, help="authors_comparison.py write's directory")
        p.add_argument("--ambiguous", type=float, default=0.5, help="leave out clients above this share")
    args = parser.parse_args()
    if args.command == "table":
        table(args)
    else:
        rescore(args)


if __name__ == "__main__":
    main()
