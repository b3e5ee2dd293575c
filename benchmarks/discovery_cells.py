"""Concept discovery on cells it was not chosen on: any configuration over five cells, one JSON line
per (cell, configuration, seed, rounds), and a table per cell.

Cells (``CELLS``; the data and models are ``_discovery_data.py``'s):

* ``tabular-mixed``: the tabular concept-shift set with the mixed rules (three concepts that are
  labelling rules: a half-space, an exclusive or, a radial threshold); 30 clients, 10 per round,
  5 local steps of 32, an MLP (64, 64), SGD lr 0.05, momentum kept between rounds.
* ``tabular-one``: the same set and recipe with one concept (every client labels by the seed's
  rule ``seed % 3``): a discovery policy should end with one model.
* ``digits-half`` / ``digits-all``: digits-28 in the FedRC scenario (30 clients, three label-map
  concepts), a CNN 16/32/128, 5 local steps of 32, lr 0.05, momentum kept; 15 (half) or all 30
  clients per round.
* ``main-job``: ``fedcluster fit``'s data, model and recipe (``MAIN_JOB_DEFAULTS``: digits, 30
  clients, Dirichlet 1.0, an MLP with lr 0.2, 10 clients per round, 5 local steps), the data seeded
  with the run's seed, and only the algorithm swapped.

Configurations (``CONFIGS``): ``fedavg``; ``fedrc3`` the paper's FedRC at the true K
(``FedRCStrategy(3)``); ``fedrc6`` (``FedRCStrategy(6)``); ``ifca3`` (``IFCAStrategy(3)``);
``policy``, ``FedRCStrategy(6, discovery=ConceptDiscovery())`` (the concept-discovery policy with
its defaults, the same object on every cell); ``fedem3`` (``FedEMStrategy(3)``) and ``fedem-policy``
(``FedEMStrategy(6, discovery=ConceptDiscovery())``).

Each run validates every round and keeps the checkpoint of the best validation global accuracy;
its line holds the test global accuracy and the concept ARI of the clients' largest ω at the last
round and at that best-validation round (validation and test rows are disjoint: each client's
held-out rows are split once, ``val_share``; ``val_test_shared_rows`` counts the rows both read, 0),
the models alive at the end, the fit's wall seconds (validation included), torch's thread count and
the machine (platform, CPU count, load average at the start and the end). Runs are deterministic.
Seeds 100–104 (held aside: no discovery configuration was chosen on them) are the default.

    OMP_NUM_THREADS=1 python benchmarks/discovery_cells.py --cells tabular-mixed tabular-one \\
        --configs fedavg fedrc3 ifca3 --rounds 40 120 --out R.jsonl
    python benchmarks/discovery_cells.py --summarise R.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _common import cpu_model, make_trainer, quiet, set_threads
from _discovery_data import HELD_ASIDE, append_record, concept_set, digits_model, digits_set, tabular_model
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fedcluster import (
    ConceptDiscovery,
    FedAvgStrategy,
    FedEMStrategy,
    FederatedDataModule,
    FedRCStrategy,
    IFCAStrategy,
)
from lightning_fedcluster.cli import MAIN_JOB_DEFAULTS

DEFAULT_SEEDS = list(HELD_ASIDE)[:5]


@dataclass(frozen=True)
class Cell:
    """A cell: its data and model for a seed, and the recipe's strategy keywords."""

    build: Callable[[int], tuple[FederatedDataModule, pl.LightningModule]]
    recipe: dict[str, Any]


def _instantiate(spec: dict[str, Any], **overrides: Any) -> Any:
    """A class from a LightningCLI ``class_path`` / ``init_args`` entry."""
    module, name = spec["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**{**spec.get("init_args", {}), **overrides})


def _main_job(seed: int) -> tuple[FederatedDataModule, pl.LightningModule]:
    return _instantiate(MAIN_JOB_DEFAULTS["data"], seed=seed), _instantiate(MAIN_JOB_DEFAULTS["model"])


_MAIN_STRATEGY = MAIN_JOB_DEFAULTS["trainer.strategy"]["init_args"]
_TABULAR = dict(clients_per_round=10, local_steps=5, optimizer_state="persist")
_DIGITS = dict(local_steps=5, optimizer_state="persist")
CELLS: dict[str, Cell] = {
    "tabular-mixed": Cell(lambda seed: (concept_set(seed, "mixed"), tabular_model()), _TABULAR),
    "tabular-one": Cell(lambda seed: (concept_set(seed, "mixed", concepts=1), tabular_model()), _TABULAR),
    "digits-half": Cell(
        lambda seed: (digits_set(seed), digits_model()), {**_DIGITS, "clients_per_round": 15}
    ),
    "digits-all": Cell(lambda seed: (digits_set(seed), digits_model()), {**_DIGITS, "clients_per_round": 30}),
    "main-job": Cell(_main_job, {k: _MAIN_STRATEGY[k] for k in ("clients_per_round", "local_steps")}),
}


# name -> strategy given the recipe's keywords (seed included)
CONFIGS: dict[str, Callable[..., Any]] = {
    "fedavg": lambda **recipe: FedAvgStrategy(**recipe),
    "fedrc3": lambda **recipe: FedRCStrategy(3, **recipe),
    "fedrc6": lambda **recipe: FedRCStrategy(6, **recipe),
    "ifca3": lambda **recipe: IFCAStrategy(3, **recipe),
    "policy": lambda **recipe: FedRCStrategy(6, discovery=ConceptDiscovery(), **recipe),
    "fedem3": lambda **recipe: FedEMStrategy(3, **recipe),
    "fedem-policy": lambda **recipe: FedEMStrategy(6, discovery=ConceptDiscovery(), **recipe),
}


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpu_count": os.cpu_count()}


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _origins(dm: FederatedDataModule, stage: str, parts: tuple[str, ...]) -> set[tuple[int, int]]:
    """(client, position within the client's held-out or global rows) of every row a stage reads."""
    origins: set[tuple[int, int]] = set()
    for part in parts:
        offsets = dm.evaluation_split(stage, part)[2]
        client = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
        origins |= set(zip(client.tolist(), dm.evaluation_rows(stage, part).tolist(), strict=True))
    return origins


def shared_rows(dm: FederatedDataModule) -> int:
    """Rows read both by validation and by test (the participating clients' held-out rows, and the
    global clients' adapt and score rows): 0 when the two are disjoint."""
    total = 0
    for parts in (("local",), ("global_adapt", "global_score")):
        total += len(_origins(dm, "val", parts) & _origins(dm, "test", parts))
    return total


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def run(cell: str, config: str, seed: int, rounds: int) -> dict[str, Any]:
    """One fit with validation every round; test at the last and at the best-validation round."""
    load_start = load_average()
    pl.seed_everything(seed, verbose=False)
    dm, model = CELLS[cell].build(seed)
    strategy = CONFIGS[config](**CELLS[cell].recipe, seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        best = ModelCheckpoint(dirpath=folder, monitor="val/global_acc", mode="max", save_top_k=1)
        trainer = make_trainer(strategy, rounds, validate=True, callbacks=[best], enable_checkpointing=True)
        start = time.perf_counter()
        trainer.fit(model, datamodule=dm)
        seconds = time.perf_counter() - start
        threads = torch.get_num_threads()
        last = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
        models = int(trainer.lightning_module.client_state.active.sum())
        chosen = trainer.test(trainer.lightning_module, datamodule=dm, ckpt_path="best", verbose=False)[0]
        best_round = int(torch.load(best.best_model_path, weights_only=False)["epoch"]) + 1
    return {
        "cell": cell, "config": config, "seed": seed, "rounds": rounds,
        "global_last": round(last["test/global_acc"], 4), "ari_last": _finite(last["test/concept_ari"]),
        "global_best": round(chosen["test/global_acc"], 4), "ari_best": _finite(chosen["test/concept_ari"]),
        "best_round": best_round, "val_global_best": round(float(best.best_model_score), 4),
        "local_last": round(last["test/local_acc"], 4), "models_end": models,
        "val_test_shared_rows": shared_rows(dm), "wall_s": round(seconds, 1), "torch_threads": threads,
        **machine(), "load_start": load_start, "load_end": load_average(),
        "torch": torch.__version__, "commit": _commit(),
    }  # fmt: skip


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def _key(record: dict[str, Any]) -> tuple[str, str, int, int]:
    return record["cell"], record["config"], record["seed"], record["rounds"]


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean_sd(values: Sequence[float]) -> str:
    if not values:
        return "–"
    sd = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{sd}"


def _seeds(seeds: Sequence[int]) -> str:
    """Seeds as "100–104" when consecutive, else "100, 102"."""
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _counts(values: Sequence[int]) -> str:
    """Models at the end: "3" when every seed agrees, else "1 ×4, 2 ×1"."""
    tally = sorted({v: values.count(v) for v in values}.items())
    return str(tally[0][0]) if len(tally) == 1 else ", ".join(f"{v} ×{n}" for v, n in tally)


def _config_order(config: str) -> tuple[int, str]:
    """Tables list the configurations in ``CONFIGS`` order, then any a record names that the
    script no longer runs (an earlier version of one, e.g. ``policy-first``), by name."""
    names = list(CONFIGS)
    return (names.index(config), "") if config in names else (len(names), config)


def summarise(path: Path) -> str:
    """A markdown table per cell: per configuration and run length, the test global accuracy at the
    last and at the best-validation round (mean ± sd over seeds), how many seeds' last round has
    concept ARI ≥ 0.8, the models at the end and the mean wall seconds. A run recorded twice counts
    once; a rerun that differs is named below the table."""
    runs: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    differing: list[str] = []
    for record in read_records(path):
        first = runs.setdefault(_key(record), record)
        if (first["global_last"], first["global_best"]) != (record["global_last"], record["global_best"]):
            differing.append(" ".join(map(str, _key(record))))
    lines: list[str] = []
    for cell in [c for c in CELLS if any(k[0] == c for k in runs)]:
        lines += [f"### {cell}", ""]
        lines += [
            "| configuration | rounds | seeds | global, last round | global, best validation | "
            "ARI ≥ 0.8 | models at the end | wall s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        groups = sorted(
            {(k[1], k[3]) for k in runs if k[0] == cell}, key=lambda g: (g[1], _config_order(g[0]))
        )
        for config, rounds in groups:
            rows = [runs[k] for k in sorted(runs) if k[0] == cell and k[1] == config and k[3] == rounds]
            aris = [r["ari_last"] for r in rows if r["ari_last"] is not None]
            placed = f"{sum(a >= 0.8 for a in aris)} of {len(aris)}" if aris else "–"
            lines.append(
                f"| {config} | {rounds} | {_seeds([r['seed'] for r in rows])} "
                f"| {_mean_sd([r['global_last'] for r in rows])} "
                f"| {_mean_sd([r['global_best'] for r in rows])} "
                f"| {placed} | {_counts([r['models_end'] for r in rows])} "
                f"| {statistics.fmean(r['wall_s'] for r in rows):.0f} |"
            )
        lines.append("")
    if differing:
        lines.append("Reruns that differ from the first record: " + "; ".join(differing))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=["fedavg", "fedrc3"])
    parser.add_argument("--seeds", type=int, nargs="+", default=DEFAULT_SEEDS)
    parser.add_argument("--rounds", type=int, nargs="+", default=[40], help="run lengths (rounds each)")
    parser.add_argument("--out", type=Path, help="append one JSON line per run")
    parser.add_argument(
        "--skip-done", action="store_true", help="skip the runs the --out file already holds (to resume)"
    )
    parser.add_argument("--summarise", type=Path, help="print a record file's tables and exit")
    args = parser.parse_args(argv)
    if args.summarise is not None:
        print(summarise(args.summarise))
        return
    if any(r < 1 for r in args.rounds):
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    done = {_key(r) for r in read_records(args.out)} if args.skip_done and args.out else set()
    set_threads(1)
    quiet()
    print(f"machine: {machine()}, load {load_average()}, torch threads 1", flush=True)
    print(
        f"{'cell':<14} {'config':<8} {'seed':>4} {'rounds':>6} {'last':>6} {'best':>6} {'ARI':>5} "
        f"{'K':>2} {'s':>6}"
    )
    for cell in args.cells:
        for rounds in args.rounds:
            for config in args.configs:
                for seed in args.seeds:
                    if (cell, config, seed, rounds) in done:
                        continue
                    record = run(cell, config, seed, rounds)
                    ari = "–" if record["ari_last"] is None else f"{record['ari_last']:.2f}"
                    print(
                        f"{cell:<14} {config:<8} {seed:>4} {rounds:>6} {record['global_last']:>6.3f} "
                        f"{record['global_best']:>6.3f} {ari:>5} {record['models_end']:>2} "
                        f"{record['wall_s']:>6.1f}",
                        flush=True,
                    )
                    append_record(args.out, record)


if __name__ == "__main__":
    main()
