"""Why a run's model falls to chance after the grouping or a K event (one concept,
K -> 1). Trains one ``takeoff_runs.py`` job and prints, per round, for each alive cluster its
global model's parameter norm, how far the round moved it (``update_norm``, as
``TakeoffDiagnostics`` records it), and the mean and largest norm over the clients of their
persisted SGD momentum for it (the authors' recipe keeps momentum between rounds); the median,
90th percentile and largest norm of the local gradients its clients' steps took (before any
``gradient_clip_val``; ``GradientNorms`` wraps the loop executor's clipping call); the clients'
mean largest ω; the round's training loss and accuracy; and every 5 rounds the global accuracy.

Probes of the cause (diagnostics, not library options): ``--no-k-events`` runs the same grouping
and floor without merges, retirement and removal; ``--k-events-after R`` starts all three after
round R instead (the configuration's 25 is the round the grouping's hold ends);
``--restart-momentum-after R`` drops every client's persisted optimizer state after round R
(e.g. the grouping round, 15); ``--group-hold N`` keeps ω as grouped for N rounds instead of the
configuration's hold (e.g. 40, past the run's end: does a model fall while no client can leave it?).

    python benchmarks/fall_probe.py --data-root /work/takeoff --seed 2 --rounds 32
    python benchmarks/fall_probe.py --data-root /work/takeoff --seed 2 --rounds 32 --no-k-events
    python benchmarks/fall_probe.py --data-root /work/takeoff --seed 2 --rounds 32 --restart-momentum-after 15
    python benchmarks/fall_probe.py --data-root /work/takeoff --cell a10 --seed 0 --rounds 50 \\
        --config robust10+merge+removal+floor10+ramp4+events30+gretire10-k6 --group-hold 40
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_fedcluster.engine.executors import loop
from lightning_fedcluster.engine.gradient_clipping import copy_gradients, gradient_norm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import make_trainer, quiet, set_threads  # noqa: E402
from _takeoff_evaluation import make_evaluation  # noqa: E402
from authors_comparison import authors_model, make_strategy, read  # noqa: E402
from takeoff_configs import CELLS, CONFIGS, K_EVENT_ROUNDS, K_EVENTS, ONE_CONCEPT, k_events_from  # noqa: E402

from lightning_fedcluster.callbacks.takeoff_diagnostics import flat_models  # noqa: E402

DEFAULT_CONFIG = "robust10+merge+removal+floor10"


def probe_options(
    options: dict[str, Any], no_k_events: bool, k_events_after: int | None, group_hold: int | None = None
) -> dict[str, Any]:
    """The configuration's options without its K events, or with each present one from round
    ``k_events_after`` on; with ``group_hold``, that hold instead of the configuration's."""
    if group_hold is not None:
        options = {**options, "group_hold": group_hold}
    if no_k_events:
        k_event_keys = K_EVENTS + K_EVENT_ROUNDS
        return {key: value for key, value in options.items() if key not in k_event_keys}
    if k_events_after is None:
        return dict(options)
    return k_events_from(options, k_events_after)


class GradientNorms:
    """Every local step's gradient norm per trained copy, before clipping: ``install`` wraps the
    loop executor's ``clip_copy_gradients`` call until ``remove`` (a diagnostic of this script,
    not an engine hook)."""

    def __init__(self) -> None:
        self.norms: dict[int, list[float]] = {}
        self.original: Any = None

    def install(self) -> None:
        clip = self.original = loop.clip_copy_gradients

        def recording(models: Any, copies: Any, max_norm: float | None) -> None:
            for k in copies:
                grads = copy_gradients(models[k])
                if grads:
                    self.norms.setdefault(k, []).append(float(gradient_norm(grads)))
            clip(models, copies, max_norm)

        loop.clip_copy_gradients = recording

    def remove(self) -> None:
        if self.original is not None:
            loop.clip_copy_gradients, self.original = self.original, None

    def take(self) -> dict[int, dict[str, float]]:
        """The round's median, 90th percentile and largest norm per cluster, and how many steps;
        then forget them."""
        summary = {}
        for k, values in sorted(self.norms.items()):
            ordered = sorted(values)
            summary[k] = {
                "median": ordered[len(ordered) // 2],
                "p90": ordered[int(0.9 * (len(ordered) - 1))],
                "max": ordered[-1],
                "steps": len(ordered),
            }
        self.norms = {}
        return summary


class FallProbe(pl.Callback):
    """Per round: model and update norms, persisted momentum norms, local gradient norms, ω
    concentration, loss."""

    def __init__(self, restart_after: int | None) -> None:
        self.restart_after = restart_after
        self.rows: list[dict[str, Any]] = []
        self.gradients = GradientNorms()

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.gradients.install()

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.gradients.remove()

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.start = flat_models(module)

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        state, layout = module.client_state, module.optimizer_layout
        end = flat_models(module)
        row: dict[str, Any] = {"round": trainer.current_epoch + 1, "clusters": {}}
        for k in state.active.nonzero().flatten().tolist():
            entries = layout.copy_entries(k)
            momentum = [  # a client whose state for k does not exist (yet, or restarted) counts 0
                float(torch.cat([vector[e.offset : e.offset + e.numel].float() for e in entries]).norm())
                if bool(state.optimizer_started[client, k])
                else 0.0
                for client, vector in state.optimizer.items()
            ]
            row["clusters"][k] = {
                "model_norm": float(end[k].norm()),
                "update_norm": float((end[k] - self.start[k]).norm()),
                "momentum_mean": sum(momentum) / max(len(momentum), 1),
                "momentum_max": max(momentum, default=0.0),
            }
        gradients = self.gradients.take()
        for k, cluster in row["clusters"].items():
            cluster["gradient_norm"] = gradients.get(k)
        row["omega_max_mean"] = float(state.omega[state.seen].max(1).values.mean())
        row["loss"] = float(module.round_metrics.get("train/loss", float("nan")))
        row["train_acc"] = float(module.round_metrics.get("train/acc", float("nan")))
        if self.restart_after == row["round"]:
            state.optimizer_started[:] = False  # every client's next step starts a fresh momentum
            row["restarted_momentum"] = True
        self.rows.append(row)
        cells = "  ".join(
            f"c{k} |θ| {c['model_norm']:.2f} |Δ| {c['update_norm']:.3f} "
            f"m {c['momentum_mean']:.1f}/{c['momentum_max']:.1f}"
            + _gradient_text(c["gradient_norm"])
            for k, c in row["clusters"].items()
        )
        note = "  (momentum restarted)" if row.get("restarted_momentum") else ""
        print(
            f"round {row['round']:3d}  {cells}  ω max {row['omega_max_mean']:.2f}  loss {row['loss']:.3f}  "
            f"acc {row['train_acc']:.3f}{note}",
            flush=True,
        )


def _gradient_text(norms: dict[str, float] | None) -> str:
    return "" if norms is None else f" g {norms['p90']:.2f}/{norms['max']:.2f}"


def check_rounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Round arguments that would silently never act are refused before training."""
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    restart = args.restart_momentum_after
    if restart is not None and not 1 <= restart < args.rounds:
        parser.error(
            f"--restart-momentum-after must be a round in 1..{args.rounds - 1} (--rounds {args.rounds}), "
            f"got {restart}"
        )
    if args.k_events_after is not None and not 0 <= args.k_events_after < args.rounds:
        parser.error(
            f"--k-events-after must be in 0..{args.rounds - 1} (--rounds {args.rounds}), "
            f"got {args.k_events_after}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, type=Path, help="takeoff_data.py writes it")
    parser.add_argument("--cell", default="m10-one", choices=[*CELLS, ONE_CONCEPT])
    parser.add_argument("--config", default=DEFAULT_CONFIG, choices=sorted(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=32)
    parser.add_argument(
        "--no-k-events", action="store_true", help="the grouping and floor, no merge, retirement or removal"
    )
    parser.add_argument("--k-events-after", type=int, default=None, metavar="ROUND")
    parser.add_argument("--restart-momentum-after", type=int, default=None, metavar="ROUND")
    parser.add_argument("--group-hold", type=int, default=None, metavar="ROUNDS", help="this hold instead")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = parser.parse_args()
    kind, k, options = CONFIGS[args.config]
    if kind != "fedrc":
        parser.error(f"--config {args.config} is not a FedRC configuration")
    if args.no_k_events and args.k_events_after is not None:
        parser.error("--no-k-events and --k-events-after contradict each other: give one")
    check_rounds(parser, args)
    if args.group_hold is not None and (args.group_hold < 1 or "group_round" not in options):
        parser.error(
            f"--group-hold must be >= 1 and needs a configuration with the grouping (group_round), "
            f"got {args.group_hold} with --config {args.config}"
        )
    options = probe_options(options, args.no_k_events, args.k_events_after, args.group_hold)
    quiet()
    set_threads(args.threads)  # with OMP_NUM_THREADS, or the launcher resets it to the cores
    dm, global_clients, _ = read(args.data_root / args.cell)
    torch.manual_seed(args.seed)
    model, _ = authors_model()
    strategy, _ = make_strategy("persist", args.seed, {**options, "executor": "loop"}, k)
    name = f"{args.config}/{args.cell}/s{args.seed}"
    evaluation = make_evaluation(5, options.get("label_stats_floor", 1e-8), name)
    probe = FallProbe(args.restart_momentum_after)
    callbacks = [evaluation(global_clients), probe]
    trainer = make_trainer(strategy, args.rounds, validate=False, callbacks=callbacks)
    trainer.fit(model, datamodule=dm)
    if args.out is not None:
        args.out.write_text(json.dumps(probe.rows))


if __name__ == "__main__":
    main()
