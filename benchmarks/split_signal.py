"""Whether a cluster holding two concepts can be told from one holding one: the signal a split of
concept discovery would need.

Runs ``FedRCStrategy(6, discovery=ConceptDiscovery())`` on a cell of ``discovery_cells.py`` for a
seed and a number of rounds, then, for every alive cluster with at least ``MIN_MEMBERS`` clients
whose largest ω is on it, partitions those clients in two (the clearest 2-medoid partition,
``best_partition``) by two per-client signals taken at the cluster's own model:

- ``gradient``: the gradient of the client's mean loss over its training rows (every parameter),
  by cosine distance, as CFL splits a cluster (and CFL's own ratio ‖mean gradient‖ / max ‖g_i‖);
- ``signature``: the label-conditioned mean prediction (``algorithms/signatures.py``), as the
  concept grouping compares clients.

Each line gives the cluster's concept mix, each partition's silhouette (1: two tight groups far
apart, 0: no structure) and its ARI against the clients' concepts (only where the cluster holds
two or more), the smaller group's client count. A split rule needs the merged clusters' silhouette
above every one-concept cluster's; ``results/discovery_off_cells.md`` ("A split") has what it reads.

    OMP_NUM_THREADS=1 python benchmarks/split_signal.py --cell tabular-mixed --rounds 40 --seeds 104 0 1
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _common import make_trainer, quiet, set_threads
from _discovery_data import append_record
from discovery_cells import CELLS, CONFIGS, machine
from sklearn.metrics import adjusted_rand_score
from torch import Tensor

from lightning_fedcluster.algorithms.cfl import cosine_similarity_matrix
from lightning_fedcluster.algorithms.discovery.signals import best_partition
from lightning_fedcluster.algorithms.signatures import client_signature, signature_distances

MIN_MEMBERS = 4  # clients a cluster needs for a partition in two to mean anything


def two_way(distances: Tensor, concepts: list[int]) -> dict[str, Any]:
    """The clearest partition in two on ``distances`` [n, n]: its silhouette, the smaller group's
    size and, where ``concepts`` holds two or more, its ARI against them (None otherwise)."""
    groups, score = best_partition(distances, 2)
    smaller = int(min(int(groups.sum()), groups.numel() - int(groups.sum())))
    ari = adjusted_rand_score(concepts, groups.tolist()) if len(set(concepts)) > 1 else None
    return {
        "silhouette": round(score, 3),
        "smaller_group": smaller,
        "ari": None if ari is None else round(ari, 3),
    }


def client_gradients(model: torch.nn.Module, rows: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Each client's gradient of its mean cross-entropy at ``model`` [n, P] (float64), and from the
    same forward pass its predicted class probabilities (one [N_i, C] tensor per client)."""
    gradients, predictions = [], []
    for x, y in rows:
        model.zero_grad()
        logits = model(x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
        predictions.append(torch.softmax(logits.detach(), -1))
    model.zero_grad()
    return torch.stack(gradients), predictions


def cluster_signals(
    module: Any, concept: Tensor, cluster: int, members: list[int], num_classes: int
) -> dict[str, Any]:
    """One cluster's line: its concept mix and both partitions of its ``members``."""
    model = module.models[cluster].eval()
    rows = [module.split("train", i) for i in members]
    gradients, predictions = client_gradients(model, rows)
    signatures, counts = [], []
    for (_, y), predicted in zip(rows, predictions, strict=True):
        means, count = client_signature(predicted[None], y, torch.tensor([True]), num_classes)
        signatures.append(means)
        counts.append(count)
    concepts = concept[members].tolist()
    signature_d, _ = signature_distances(torch.stack(signatures), torch.stack(counts))
    return {
        "cluster": cluster,
        "clients": len(members),
        "concepts": {c: concepts.count(c) for c in sorted(set(concepts))},
        "gradient": two_way(1.0 - cosine_similarity_matrix(gradients), concepts),
        "cfl_ratio": round(float(gradients.mean(0).norm() / gradients.norm(dim=1).max()), 3),
        "signature": two_way(signature_d, concepts),
    }


def all_clusters(module: Any, concept: Tensor, num_classes: int) -> list[dict[str, Any]]:
    """``cluster_signals`` of every alive cluster with ``MIN_MEMBERS`` clients or more (the seen
    clients whose largest ω is on it)."""
    state = module.client_state
    owner = torch.where(state.active, state.omega, torch.full_like(state.omega, -1.0)).argmax(1)
    lines = []
    for k in state.active.nonzero().flatten().tolist():
        members = (state.seen & (owner == k)).nonzero().flatten().tolist()
        if len(members) >= MIN_MEMBERS:
            lines.append(cluster_signals(module, concept, k, members, num_classes))
    return lines


class SignalsAt(pl.Callback):
    """``all_clusters`` after each round in ``rounds`` (1-based, the aggregated models), the models
    put back in training mode and their gradients cleared, so the run goes on as without it."""

    def __init__(self, rounds: Sequence[int], concept: Tensor, num_classes: int) -> None:
        self.rounds, self.concept, self.num_classes = set(rounds), concept, num_classes
        self.lines: list[dict[str, Any]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        round_number = trainer.current_epoch + 1
        if round_number in self.rounds:
            modes = [m.training for m in pl_module.models]
            with torch.enable_grad():
                lines = all_clusters(pl_module, self.concept, self.num_classes)
            for m, mode in zip(pl_module.models, modes, strict=True):
                m.train(mode)
                m.zero_grad(set_to_none=True)
            self.lines += [{"round": round_number, **line} for line in lines]


def run(cell: str, seed: int, rounds: int, at: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Fit the policy; the lines after each round in ``at`` and after the last round."""
    pl.seed_everything(seed, verbose=False)
    dm, model = CELLS[cell].build(seed)
    strategy = CONFIGS["policy"](**CELLS[cell].recipe, seed=seed)
    signals = SignalsAt([r for r in at if r < rounds], dm.metadata.concept, dm.num_classes)
    trainer = make_trainer(strategy, rounds, validate=False, callbacks=[signals])
    trainer.fit(model, datamodule=dm)
    module = trainer.lightning_module
    final = all_clusters(module, dm.metadata.concept, dm.num_classes)
    lines = signals.lines + [{"round": rounds, **line} for line in final]
    return [{"cell": cell, "seed": seed, "rounds": rounds, **line} for line in lines]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", choices=sorted(CELLS), default="tabular-mixed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[104])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--at", type=int, nargs="*", default=[], help="also measure after these rounds")
    parser.add_argument("--out", type=Path, help="append one JSON line per cluster")
    args = parser.parse_args(argv)
    set_threads(1)
    quiet()
    print(f"machine: {machine()}, torch threads {torch.get_num_threads()}")
    header = ["cell", " " * 10, "seed round cluster concepts", " " * 11, "gradient sil/ARI/smaller"]
    print(*header, "  CFL ratio  signature sil/ARI")
    for seed in args.seeds:
        for line in run(args.cell, seed, args.rounds, args.at):
            g, s, mix = line["gradient"], line["signature"], json.dumps(line["concepts"])
            print(
                f"{line['cell']:<14}{seed:>5}{line['round']:>6}{line['cluster']:>8} {mix:<20}"
                f"{g['silhouette']:>8.2f} / {g['ari']!s:>5} / {g['smaller_group']:<6}"
                f"{line['cfl_ratio']:>10.3f}{s['silhouette']:>10.2f} / {s['ari']!s:>5}"
            )
            append_record(args.out, {**line, **machine()})


if __name__ == "__main__":
    main()
