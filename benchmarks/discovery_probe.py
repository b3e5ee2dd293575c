"""Concept discovery off the cells it was chosen on: a tabular concept-shift set whose concepts
are different labelling rules, and a probe that runs the library's configurations on it.

The set (``concept_set``): every client draws Gaussian inputs x ~ N(0, I_9) and labels them with
its concept's rule (``labelling_rules``: ``--rules mixed``, a half-space, an exclusive or and a
radial threshold on disjoint features; ``--rules linear``, three orthonormal half-spaces); any two
rules agree on half of the rows and each rule is balanced. 30 clients of 150–450 training rows
(plus a fifth held out for validation and test), concept c = client mod 3; one global test client
per concept (1,000 rows labelled by its rule). The concept is the labelling rule P(y | x), not a
label permutation: both classes occur under every concept with the same frequency, so nothing in
a client's labels alone tells its concept.

The run: 10 clients per round, 5 local steps of 32 rows, an MLP (64, 64), SGD lr 0.05 with
momentum 0.9 kept between rounds (``optimizer_state="persist"``), 60 rounds. Printed and written
(``--out``, JSON lines) per run: the last round's test global accuracy and concept ARI, the K the
run ends with, and the wall time. ``--diagnostics`` attaches ``TakeoffDiagnostics(gradients=True)``
and writes per round what a grouping could see: the prediction signatures' separation, and the
ARI of three groups formed from other candidate signals (see ``signal_row``).

Seeds 0–4 are the ones the findings in ``benchmarks/results/discovery_off_cells.md`` were read
on; seeds 100–119 are held aside, never run there, for checking a discovery policy later on data
it was not chosen on (``--allow-held-aside`` runs them). ``--summarise FILE`` prints a record
file's table, ``--signals FILE`` the candidate grouping signals of its diagnosed runs.

    OMP_NUM_THREADS=1 python benchmarks/discovery_probe.py --rules mixed \\
        --configs fedavg fedrc3 kdata6 ifca3 --seeds 0 1 2 3 4 --out R.jsonl
    OMP_NUM_THREADS=1 python benchmarks/discovery_probe.py --rules mixed --configs kdata6 fedrc3 \\
        --seeds 0 1 2 --diagnostics --out D.jsonl
    python benchmarks/discovery_probe.py --signals D.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _common import fedrc_keywords, machine_line, make_trainer, quiet, set_threads
from _discovery_data import (
    CONCEPTS,
    HELD_ASIDE,
    append_record,
    concept_set,
    digits_model,
    digits_set,
    rule_agreement,
    tabular_model,
)

from lightning_fedcluster import FedAvgStrategy, FedEMStrategy, FedRCStrategy, IFCAStrategy
from lightning_fedcluster.algorithms.base import masked_log_omega
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.algorithms.signatures import k_medoids
from lightning_fedcluster.callbacks.takeoff_diagnostics import TakeoffDiagnostics, separation
from lightning_fedcluster.metrics.clustering import grouping_ari

# The K-from-the-data block, verbatim from docs/how-clusters-form.md ("A 30-round hold").
K_FROM_THE_DATA: dict[str, Any] = dict(
    group_round=15,
    label_stats_floor=0.1,
    group_assign="mean",
    group_margin=0.7,
    group_hold=30,
    group_release=0.25,
    group_release_rounds=5,
    group_late_round=20,
    group_ramp=4,
    group_retire=0.1,
    merge_threshold=0.5,
    merge_after=50,
    retire_after=50,
    removal_threshold=0.1,
    removal_after=50,
    omega_weighting_from=15,
    gradient_clip_val=5.0,
)
# The K-given block (docs/how-clusters-form.md, "recommended"), with the weighting and the clip.
K_GIVEN: dict[str, Any] = dict(
    group_round=15,
    label_stats_floor=0.01,
    group_assign="mean",
    group_margin=0.7,
    group_hold=10,
    group_late_round=20,
    omega_weighting_from=15,
    gradient_clip_val=5.0,
)
# fedcluster fit's defaults (the quick start).
QUICK_START: dict[str, Any] = dict(
    group_round=20,
    group_assign="mean",
    group_margin=0.7,
    group_hold=10,
    group_late_round=25,
    omega_weighting_from=20,
    gradient_clip_val=5.0,
)
GROUPING_KEYS = [k for k in K_FROM_THE_DATA if k.startswith("group_")] + ["label_stats_floor"]


def without(options: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in keys}


# name -> (strategy class, K, keywords)
CONFIGS: dict[str, tuple[type, int, dict[str, Any]]] = {
    "fedavg": (FedAvgStrategy, 1, {}),
    "fedrc3": (FedRCStrategy, 3, {}),
    "quick3": (FedRCStrategy, 3, QUICK_START),
    "kgiven3": (FedRCStrategy, 3, K_GIVEN),
    "kdata6": (FedRCStrategy, 6, K_FROM_THE_DATA),
    "fedrc6": (FedRCStrategy, 6, {}),
    "ifca3": (IFCAStrategy, 3, {}),
    # ablations of the K-from-the-data block
    "kdata6-nomerge": (
        FedRCStrategy,
        6,
        {**without(K_FROM_THE_DATA, "merge_threshold", "merge_after"), "group_retire": None},
    ),
    "kdata6-noretire": (
        FedRCStrategy,
        6,
        without(K_FROM_THE_DATA, "retire_after", "removal_threshold", "removal_after"),
    ),
    "kdata6-nogroup": (FedRCStrategy, 6, without(K_FROM_THE_DATA, *GROUPING_KEYS)),
    # why FedRC with every client placed stays below IFCA
    "fedrc3-omegaw": (FedRCStrategy, 3, dict(omega_weighting_from=0)),
    "fedrc3-omegaw-clip": (FedRCStrategy, 3, dict(omega_weighting_from=0, gradient_clip_val=5.0)),
    "fedrc3-trhc": (FedRCStrategy, 3, dict(hard_training=True)),
    "fedem3": (FedEMStrategy, 3, {}),  # FedRC without C_y
    "fedrc3-tehc": (FedRCStrategy, 3, dict(hard_prediction=True)),
    "fedrc3-trhc-omegaw": (FedRCStrategy, 3, dict(hard_training=True, omega_weighting_from=0)),
}


def score_groups(scores: torch.Tensor, active: list[int], concept: torch.Tensor) -> tuple[float, float]:
    """Three groups of clients by their E-step score profile: per client, each alive cluster's
    mean log-likelihood per sample centred on the client's own mean over clusters (Euclidean).
    Returns the groups' ARI against the concepts and the separation (between/within)."""
    profile = scores[:, active] - scores[:, active].mean(1, keepdim=True)
    distances = torch.cdist(profile, profile)
    return grouping_ari(concept, k_medoids(distances, CONCEPTS)[0]), separation(distances, concept)


def signal_row(row: dict[str, Any], concept: torch.Tensor) -> dict[str, Any]:
    """One round's diagnostics, reduced: the grouping's own signal and the candidates."""
    scores = torch.tensor(row["cluster_scores"], dtype=torch.float64)
    score_ari, score_sep = score_groups(scores, row["active_clusters"], concept)
    omega = torch.tensor(row["omega"])
    keys = (
        "round", "ari", "active", "prediction_ari", "prediction_tv_ari", "prediction_separation",
        "prediction_within", "prediction_between", "loss_ari", "loss_separation", "gradient_ari",
        "gradient_separation", "margin_median", "update_norm_max", "omega_entropy_mean",
    )  # fmt: skip
    out = {k: row.get(k) for k in keys}
    out["score_ari"], out["score_separation"] = score_ari, score_sep
    out["model_norm_max"] = max(row["model_norm"][k] for k in row["active_clusters"])
    out["argmax_omega"] = omega.argmax(1).tolist()
    out["omega_max"] = [round(v, 3) for v in omega.max(1).values.tolist()]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


class Events(pl.Callback):
    """The server actions' notes (grouping, release, merging, retirement, removal) per round."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.events += [(trainer.current_epoch + 1, text) for text in getattr(pl_module, "round_events", [])]


class GammaSplit(pl.Callback):
    """FedRC's E-step seen from each client's own cluster (argmax ω): every ``every`` rounds, the
    mean γ of that cluster on the rows its model labels right and on those it labels wrong, and
    the share of rows it labels wrong (over all clients' training rows). A soft E-step that hands
    a model's wrong rows to other clusters trains each model least where it errs."""

    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.rows: list[dict[str, float]] = []

    @torch.no_grad()
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        round_number = trainer.current_epoch + 1
        if round_number % self.every:
            return
        state = pl_module.client_state
        log_stats = label_statistics(pl_module.rule, state)
        right, wrong, rows, errors = 0.0, 0.0, 0, 0
        for i in range(trainer.datamodule.num_clients):
            x, y = pl_module.split("train", i)
            losses, probs = pl_module.evaluate_clusters(x, y)  # [N, K], [K, N, C]
            scores = -losses if log_stats is None else -losses - log_stats[y]
            gamma = torch.softmax(scores + masked_log_omega(state.omega[i], state.active), dim=1)
            own = int(torch.where(state.active, state.omega[i], -torch.inf).argmax())
            correct = probs[own].argmax(1) == y
            right += float(gamma[correct, own].sum())
            wrong += float(gamma[~correct, own].sum())
            rows, errors = rows + y.numel(), errors + int((~correct).sum())
        self.rows.append(
            {
                "round": round_number,
                "gamma_own_right": round(right / max(rows - errors, 1), 4),
                "gamma_own_wrong": round(wrong / max(errors, 1), 4),
                "own_error": round(errors / rows, 4),
            }
        )


def run(name: str, seed: int, rounds: int, diagnostics: bool, kind: str) -> dict[str, Any]:
    strategy_class, k, options = CONFIGS[name]
    per_round = 15 if kind == "digits" else 10
    common = dict(local_steps=5, clients_per_round=per_round, optimizer_state="persist", seed=seed)
    if issubclass(strategy_class, FedRCStrategy):
        options = fedrc_keywords(options)
    strategy = strategy_class(**common, **options) if k == 1 else strategy_class(k, **common, **options)
    if kind == "digits":
        # off the take-off cells' recipe: 5 local steps, half of the clients per round, a small CNN
        dm, model = digits_set(seed), digits_model()
    else:
        dm, model = concept_set(seed, kind), tabular_model()
    probe = TakeoffDiagnostics(gradients=True) if diagnostics else None
    events, split = Events(), GammaSplit()
    callbacks = (
        [events]
        + ([probe] if probe else [])
        + ([split] if strategy_class in (FedRCStrategy, FedEMStrategy) else [])
    )
    trainer = make_trainer(strategy, rounds, validate=False, callbacks=callbacks)
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    seconds = time.perf_counter() - start
    test = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    state = trainer.lightning_module.client_state
    record: dict[str, Any] = {
        "config": name, "rules": kind, "seed": seed, "rounds": rounds,
        "global": round(test["test/global_acc"], 4),
        "local": round(test["test/local_acc"], 4), "ari": round(test.get("test/concept_ari", math.nan), 4),
        "final_k": int(state.active.sum()), "fit_s": round(seconds, 1),
    }  # fmt: skip
    record["events"] = events.events
    record["gamma_split"] = split.rows
    if probe is not None:
        concept = dm.metadata.concept.cpu()
        record["per_round"] = [signal_row(row, concept) for row in probe.rows]
    return record


def summarise(path: Path) -> None:
    """Per set and configuration in a record file: each seed's global accuracy (ARI, final K) and
    the mean accuracy. A seed recorded more than once (a rerun with diagnostics) counts once; the
    runs are deterministic, and a rerun that differs is flagged with "!"."""
    table: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        key = (record.get("rules", "linear"), record["config"], record["rounds"])
        table.setdefault(key, []).append(record)
    for (rules, name, rounds), runs in sorted(table.items()):
        by_seed: dict[int, dict[str, Any]] = {}
        for run in runs:
            first = by_seed.setdefault(run["seed"], run)
            if (run["global"], run["ari"]) != (first["global"], first["ari"]):
                first["seed"] = f"{run['seed']}!"
        records = sorted(by_seed.values(), key=lambda r: str(r["seed"]))
        cells = " | ".join(
            f"{r['seed']}: {r['global']:.3f} ({r['ari']:.2f}, K {r['final_k']})" for r in records
        )
        mean = sum(r["global"] for r in records) / len(records)
        print(f"{rules:<6} {name:<20} {rounds:>3} | {cells} | mean {mean:.3f}")


SIGNALS = ("prediction_ari", "prediction_tv_ari", "loss_ari", "gradient_ari", "score_ari")


def signals(path: Path, before: int = 14) -> None:
    """Per diagnosed run in a record file: each candidate signal's concept ARI at round ``before``
    (the last round before the grouping) and its mean over rounds 1..``before``; the prediction
    signature's distinct distance values; when the concept ARI of ω first reaches 0.8."""
    for line in path.read_text().splitlines():
        record = json.loads(line)
        rows = record.get("per_round")
        if not rows:
            continue
        early = [r for r in rows if r["round"] <= before]
        cells = []
        for key in SIGNALS:
            values = [r[key] for r in early if r.get(key) is not None]
            cells.append(f"{key.removesuffix('_ari')} {values[-1]:.2f}/{sum(values) / len(values):.2f}")
        levels = sorted({r["prediction_within"] for r in early} | {r["prediction_between"] for r in early})
        placed = next((r["round"] for r in rows if r["ari"] >= 0.8), None)
        print(
            f"{record.get('rules', 'linear'):<6} {record['config']:<18} seed {record['seed']} | "
            + " | ".join(cells)
            + f" | prediction distances {[round(v, 2) for v in levels]} | omega ARI >= 0.8 from {placed}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="+", choices=sorted(CONFIGS), default=["fedavg", "fedrc3", "kdata6", "ifca3"]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--rules",
        choices=("mixed", "linear", "digits"),
        default="mixed",
        help="see labelling_rules; digits: digits-28 images in the FedRC scenario (30 clients, label-map "
        "concepts, from_tensors), a CNN 16/32/128, 15 clients per round",
    )
    parser.add_argument("--diagnostics", action="store_true", help="per-round signals (TakeoffDiagnostics)")
    parser.add_argument("--out", type=Path, help="append one JSON line per run")
    parser.add_argument(
        "--allow-held-aside", action="store_true", help=f"run seeds {HELD_ASIDE.start}-{HELD_ASIDE.stop - 1}"
    )
    parser.add_argument("--summarise", type=Path, help="print the table of a record file and exit")
    parser.add_argument("--signals", type=Path, help="print the candidate signals of a record file and exit")
    args = parser.parse_args()
    if args.signals is not None:
        signals(args.signals)
        return
    if args.summarise is not None:
        summarise(args.summarise)
        return
    held = [s for s in args.seeds if s in HELD_ASIDE]
    if held and not args.allow_held_aside:
        parser.error(
            f"seeds {held} are held aside for checking a policy: pass --allow-held-aside to run them"
        )
    set_threads(1)
    quiet()
    print(machine_line())
    if args.rules != "digits":
        print(
            f"rules {args.rules}: agreement of pairs 01 02 12, share of label 1 per rule "
            f"(seed {args.seeds[0]}): "
            f"{[round(a, 3) for a in rule_agreement(args.seeds[0], args.rules)]}"
        )
    print(f"{'config':<20} {'seed':>4} {'global':>7} {'ARI':>6} {'K':>3} {'fit s':>7}")
    for name in args.configs:
        for seed in args.seeds:
            record = run(name, seed, args.rounds, args.diagnostics, args.rules)
            print(
                f"{name:<20} {seed:>4} {record['global']:>7.3f} {record['ari']:>6.2f} {record['final_k']:>3} "
                f"{record['fit_s']:>7.1f}",
                flush=True,
            )
            append_record(args.out, record)


if __name__ == "__main__":
    main()
