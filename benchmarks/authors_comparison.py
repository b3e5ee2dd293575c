"""The same clients for the authors' FedRC code and for this library (authors' on-disk format).

`write` builds a FashionMNIST-C-like scenario from scikit-learn's digits, upsampled to 28x28, and
writes it as the authors' FashionMNIST-C pickles, so their loader reads it as their own data:

    DIR/{i}.pkl       client i: {'images': uint8 [N, 28, 28], 'labels': uint8 [N], 'type': int};
                      training rows first, then its local test rows
    DIR/test-{k}.pkl  global test client of concept k-1 (clean images, that concept's labels);
                      adapt rows first (where its mixture weights are fitted), then score rows
    DIR/manifest.json clients, their concepts, styles, type codes, row counts, seed, hashes

The authors' client types are 0 (concept 0, clean), 1 (concept 0, corrupted), 2 / 3 (concept 1 /
2, clean) and 4 / 5 (concept 1 / 2, corrupted); concept 1 reverses the labels (9 - y) and concept 2
shifts them ((y + 1) mod 10), as this library's `label_map` does. Their FashionMNIST-C recipe:
40 / 30 / 30 % of clients per concept, half of the concept-0 clients and a third of the others
corrupted, each client's labels drawn from Dir(1.0 * p) with p the class frequencies. Digits hold
1797 images, fewer than clients x (train + test), so a client draws its rows of each class without
replacement where the class allows and clients share images; the global test clients use a
stratified 20 % hold-out that no client sees. The write side is ``authors_data.py``.

`run` reads DIR back (both sides train on identical bytes) and trains FedRCStrategy with the
authors' FashionMNIST-C hyperparameters: their CNN (FashionCNN), SGD lr 0.06, momentum 0.9,
weight decay 5e-4, batch 128, one local step, every client every round, K = 3. Inputs are
normalised as their loader does ((x / 255 - 0.1307) / 0.3081). After every round each global
client's mixture weights are fitted on its adapt rows (`ClusteredModule.adapt`, the library's
rule) and it is scored on its score rows, the rows the authors' side uses too; the library's own
validation is off. Printed per round: global accuracy per concept and their mean, the concept ARI
(argmax of the clients' mixture weights against their concepts), CPU seconds of training (the
round) and of this evaluation, and peak RSS.

    python benchmarks/authors_comparison.py write --out /tmp/fedrc-digits --clients 25 --train 160 \\
        --test 40 --concepts 3 --seed 0
    python benchmarks/authors_comparison.py run --data /tmp/fedrc-digits --rounds 25 \\
        --optimizer-state reset --seeds 0

The authors' code reads DIR when linked as their `data/fmnist-c` folder. Their loader has the
count of 300 clients and a random 90 / 10 split written in; a driver kept outside this repository
replaces those two with the manifest's counts (train / test rows of clients, adapt / score rows
of the global clients) and times their rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import pickle
import statistics
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from _common import (
    CLOCK_HELP,
    RoundTimer,
    add_grouping_arguments,
    clock,
    command_line,
    fedrc_keywords,
    grouping_options,
    machine_line,
    make_trainer,
    peak_rss_mb,
    quiet,
    set_clock,
)
from _drift_probe import DriftDiagnostics
from _takeoff_variants import anneal
from authors_data import MEAN, NUM_CLASSES, STD, add_write_arguments, write

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.callbacks.takeoff_diagnostics import TakeoffDiagnostics
from lightning_fedcluster.datamodules import (
    ClientMetadata,
    FederatedDataModule,
)
from lightning_fedcluster.metrics import concept_ari
from lightning_fedcluster.models import FashionCNN

# Their FashionMNIST-C hyperparameters (README command, utils/optim.py).
LR, MOMENTUM, WEIGHT_DECAY, BATCH, K = 0.06, 0.9, 5e-4, 128, 3


GlobalClient = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def read(data: Path) -> tuple[FederatedDataModule, list[GlobalClient], dict[str, Any]]:
    """The clients of DIR as the authors' loader gives them to their model (x / 255, normalised),
    and each global client as (concept, adapt x, adapt y, score x, score y)."""
    manifest = json.loads((data / "manifest.json").read_text())

    def load(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        raw = (data / name).read_bytes()
        if manifest["sha256"][name] != hashlib.sha256(raw).hexdigest():
            raise SystemExit(f"{data / name} does not match the manifest's hash: rewrite DIR")
        record = pickle.loads(raw)
        x = torch.from_numpy(record["images"].astype(np.float32) / 255.0).unsqueeze(1)
        return (x - MEAN) / STD, torch.from_numpy(record["labels"].astype(np.int64))

    train, test = [], []
    for client in manifest["clients"]:
        x, y = load(client["file"])
        n = client["train"]
        train.append((x[:n], y[:n]))
        test.append((x[n:], y[n:]))
    global_clients = []
    for entry in manifest["global"]:
        x, y = load(entry["file"])
        a = entry["adapt"]
        global_clients.append((entry["concept"], x[:a], y[:a], x[a:], y[a:]))
    metadata = ClientMetadata(
        concept=torch.tensor([c["concept"] for c in manifest["clients"]]),
        feature_style=[c["feature_style"] for c in manifest["clients"]],
        global_concept=torch.empty(0, dtype=torch.long),
    )
    dm = FederatedDataModule(
        train, test, num_classes=manifest["num_classes"], batch_size=BATCH, metadata=metadata
    )
    return dm, global_clients, manifest


def authors_model() -> tuple[FashionCNN, str]:
    """FashionCNN with the authors' SGD; weight decay through the hyperparameter the reference
    classifiers' configure_optimizers reads where the constructor does not take it."""
    if "weight_decay" in inspect.signature(FashionCNN).parameters:
        return FashionCNN(NUM_CLASSES, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY), "constructor"
    model = FashionCNN(NUM_CLASSES, lr=LR, momentum=MOMENTUM)
    model.hparams["weight_decay"] = WEIGHT_DECAY
    return model, "hparams (FashionCNN takes no weight_decay argument)"


def make_strategy(
    optimizer_state: str, seed: int, server: dict[str, Any], k: int = K
) -> tuple[FedRCStrategy, str]:
    """FedRCStrategy with ``optimizer_state`` where the library has it. An unknown keyword is not
    refused: FederatedStrategy hands it to Lightning's DDPStrategy, which keeps it as a
    DistributedDataParallel argument that is never used, so support is read from the signatures."""
    options = dict(local_steps=1, clients_per_round=None, seed=seed, **server)
    known = any(
        "optimizer_state" in inspect.signature(cls.__init__).parameters
        for cls in FedRCStrategy.__mro__
        if "__init__" in vars(cls) and cls.__module__.startswith("lightning_fedcluster")
    )
    if not known:
        return FedRCStrategy(k, **fedrc_keywords(options)), "unsupported"
    strategy = FedRCStrategy(k, optimizer_state=optimizer_state, **fedrc_keywords(options))
    if "optimizer_state" in getattr(strategy, "_ddp_kwargs", {}):
        return FedRCStrategy(k, **fedrc_keywords(options)), "unsupported"
    return strategy, optimizer_state


class GlobalEvaluation(pl.Callback):
    """After every round (give it after the RoundTimer, whose hook then runs first): each global
    client's ω from its adapt rows, its accuracy on its score rows, the concept ARI of the
    participating clients' ω, the round's CPU seconds, this evaluation's, and peak RSS."""

    def __init__(
        self, timer: RoundTimer, global_clients: list[GlobalClient], echo: bool, every: int = 1
    ) -> None:
        self.timer, self.global_clients, self.echo, self.rows = timer, global_clients, echo, []
        self.concepts = [g[0] for g in global_clients]
        self.every = every

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        start = clock()
        row: dict[str, float] = {}
        number = len(self.rows) + 1
        scored = number % self.every == 0 or number == trainer.max_epochs
        for concept, xa, ya, xs, ys in self.global_clients:
            if not scored:  # --eval-every: the accuracy of this round is not measured
                row[f"acc{concept}"] = float("nan")
                continue
            omega = pl_module.adapt(xa, ya)
            predicted = pl_module.predict_proba(xs, omega).argmax(1).cpu()
            row[f"acc{concept}"] = float((predicted == ys).double().mean())
        row["acc"] = statistics.mean(row[f"acc{c}"] for c in self.concepts)
        state = pl_module.client_state
        row["ari"] = concept_ari(state.omega, trainer.datamodule.metadata.concept, state.seen)
        row.update(train_s=self.timer.rounds[-1]["round"], eval_s=clock() - start, rss=peak_rss_mb())
        self.rows.append(row)
        if self.echo:
            print(format_row(str(len(self.rows)), row, self.concepts), flush=True)


def header_line(concepts: list[int]) -> str:
    names = [f"acc c{c}" for c in concepts] + ["mean acc", "ARI", "train CPU-s", "eval CPU-s", "peak MB"]
    return f"{'round':<10}" + "".join(f"{n:>12}" for n in names)


def format_row(name: str, row: dict[str, float], concepts: list[int]) -> str:
    cells = [f"{100 * row[f'acc{c}']:.1f}" for c in concepts]
    cells += [
        f"{100 * row['acc']:.1f}",
        f"{row['ari']:.2f}",
        f"{row['train_s']:.2f}",
        f"{row['eval_s']:.2f}",
        f"{row['rss']:.0f}",
    ]
    return f"{name:<10}" + "".join(f"{c:>12}" for c in cells)


def server_options(args: argparse.Namespace) -> dict[str, Any]:
    """The server optimizer's arguments of FedRCStrategy, as given on the command line."""
    options: dict[str, Any] = {}
    if args.server_optimizer != "none":
        options["server_optimizer"] = args.server_optimizer
    if args.server_lr != 1.0:
        options["server_lr"] = args.server_lr
    if args.server_momentum is not None:
        options["server_momentum"] = args.server_momentum
    if args.optimizer_state_dtype != "float32":
        options["optimizer_state_dtype"] = args.optimizer_state_dtype
    if args.optimizer_state_dir is not None:
        options["optimizer_state_dir"] = args.optimizer_state_dir
    options.update(grouping_options(args))
    if args.merge_threshold is not None:
        options.update(merge_threshold=args.merge_threshold, merge_after=args.merge_after)
    if args.label_stats_floor is not None:
        options["label_stats_floor"] = args.label_stats_floor
    return options


def run(args: argparse.Namespace) -> None:
    quiet()
    set_clock(args.clock)
    dm, global_clients, manifest = read(Path(args.data))
    concepts = [g[0] for g in global_clients]
    print(machine_line())
    print(f"command: {command_line()}")
    sizes = dm.train_sizes
    print(
        f"data: {args.data}: {dm.num_clients} clients x {int(sizes.min())}-{int(sizes.max())} train rows, "
        f"written with seed {manifest['seed']}; global clients of concepts {concepts}: "
        f"{[int(g[2].numel()) for g in global_clients]} adapt / "
        f"{[int(g[4].numel()) for g in global_clients]} score rows"
    )
    finals = []
    for seed in args.seeds:
        torch.manual_seed(seed)
        model, decay_via = authors_model()
        strategy, state = make_strategy(args.optimizer_state, seed, server_options(args), args.num_clusters)
        anneal(strategy, args.anneal)
        if state == "unsupported":
            print(
                f"NOTE: FedRCStrategy does not accept optimizer_state yet; '{args.optimizer_state}' was "
                "requested, this run uses the library's current behaviour (a fresh optimizer per "
                "client and round)"
            )
        print(
            f"seed {seed}: FedRCStrategy(K={args.num_clusters}, local_steps=1, all clients, "
            f"optimizer_state={state}, "
            f"{', '.join(f'{k}={v}' for k, v in server_options(args).items()) or 'no server optimizer'}"
            f"{f', annealed E-step {args.anneal}' if args.anneal else ''}), "
            f"FashionCNN SGD lr {LR} momentum {MOMENTUM} weight decay {WEIGHT_DECAY} via {decay_via}, "
            f"batch {BATCH}, {args.rounds} rounds, precision {args.precision}; train CPU-s: the round "
            "(E-step, local steps, aggregation); eval CPU-s: adapt + score of the global clients"
        )
        timer = RoundTimer()
        evaluation = GlobalEvaluation(
            timer, global_clients, echo=not args.quiet_rounds, every=args.eval_every
        )
        callbacks: list[pl.Callback] = [timer, evaluation]
        if args.diagnostics is not None:
            path = Path(args.diagnostics) / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            if args.diagnostics_from is None:
                probe = TakeoffDiagnostics(gradients=args.gradients, path=path, keep_signatures=True)
            else:
                probe = DriftDiagnostics(
                    args.diagnostics_from, gradients=args.gradients, path=path, keep_signatures=True
                )
            callbacks.append(probe)
        trainer = make_trainer(
            strategy,
            args.rounds,
            validate=False,
            callbacks=callbacks,
            precision=args.precision,
            accelerator=args.accelerator,
        )
        print(header_line(concepts))
        trainer.fit(model, datamodule=dm)
        last = dict(evaluation.rows[-1])
        last["train_s"] = statistics.median(r["train_s"] for r in evaluation.rows)
        last["eval_s"] = statistics.median(r["eval_s"] for r in evaluation.rows if r["acc"] == r["acc"])
        finals.append(last)
        if args.diagnostics is not None:
            print(f"diagnostics of seed {seed}: {Path(args.diagnostics) / f'seed{seed}.json'}")
        print(format_row(f"s{seed} last", last, concepts) + "   (CPU-s: medians over rounds)")
    if len(finals) > 1:
        mean = {key: statistics.mean(row[key] for row in finals) for key in finals[0]}
        print(format_row("mean", mean, concepts) + f"   over seeds {args.seeds}")
    print(f"peak RSS of this process: {peak_rss_mb():.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    w = commands.add_parser("write", help="write the scenario in the authors' FashionMNIST-C format")
    add_write_arguments(w)
    r = commands.add_parser("run", help="train this library's FedRC on a written scenario")
    r.add_argument("--data", required=True)
    r.add_argument("--rounds", type=int, default=25)
    r.add_argument("--optimizer-state", choices=("reset", "persist"), default="reset")
    r.add_argument(
        "--optimizer-state-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
        help="dtype of the persistent optimizer-state store (with --optimizer-state persist)",
    )  # fmt: skip
    r.add_argument(
        "--optimizer-state-dir", default=None,
        help="keep the persistent optimizer-state store in a file in this directory, not in memory",
    )  # fmt: skip
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument(
        "--precision", choices=("32-true", "bf16-mixed"), default="32-true",
        help="Trainer(precision=...): bf16-mixed runs every forward under bfloat16 autocast",
    )  # fmt: skip
    r.add_argument("--server-optimizer", choices=("none", "momentum", "adam"), default="none")
    r.add_argument("--server-lr", type=float, default=1.0, help="η_g")
    r.add_argument("--server-momentum", type=float, default=None, help="β of --server-optimizer momentum")
    r.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    r.add_argument(
        "--eval-every", type=int, default=1,
        help="score the global clients every this many rounds and at the last (ARI: every round)",
    )  # fmt: skip
    r.add_argument("--num-clusters", type=int, default=K, help="K (the authors' 3)")
    r.add_argument("--group-round", type=int, default=None, help="FedRC's concept grouping after this round")
    r.add_argument("--label-stats-floor", type=float, default=None, help="FedRC's floor of C (theirs 1e-8)")
    r.add_argument("--merge-threshold", type=float, default=None, help="FedRC's cluster merging (nats)")
    r.add_argument("--merge-after", type=int, default=0, help="first round index a merge may follow")
    add_grouping_arguments(r)
    r.add_argument("--anneal", default=None, help="BETA0:ROUNDS, an annealed E-step (_takeoff_variants.py)")
    r.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu", help="Lightning's accelerator")
    r.add_argument("--quiet-rounds", action="store_true", help="print only each seed's last round")
    r.add_argument(
        "--diagnostics", default=None,
        help="record TakeoffDiagnostics every round and write DIR/seed<s>.json (one extra pass per round)",
    )  # fmt: skip
    r.add_argument(
        "--gradients", action="store_true", help="with --diagnostics: last-layer gradient signatures"
    )
    r.add_argument(
        "--diagnostics-from", type=int, default=None,
        help="with --diagnostics: record from this round on, with the E-step's parts (_drift_probe.py)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.command == "write":
        write(args)
    else:
        run(args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
