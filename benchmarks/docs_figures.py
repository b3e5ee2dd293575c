"""The documentation's figures, from real runs of the main job (``fedcluster fit``'s scenario).

Trains FedRC, FedEM, IFCA and FedAvg on DigitsFederated (30 clients, three concepts, label
shift, corrupted clients; 10 clients per round, 5 local steps, MLP lr 0.2, 150 rounds, validation
every 25) with a TensorBoardLogger, then reads the event files back and writes, into
``docs/figures/`` (or ``--out``):

- ``tensorboard_scalars.png``: the FedRC run's scalars as TensorBoard plots them, with the round
  as the step (train/loss, validation and test accuracies, concept ARI, concept shares);
- the FedRC run's images exactly as TensorBoard's Images tab shows them (PNG bytes from the event
  file): ``omega_clients_by_concept.png``, ``concept_shares.png``, ``label_stats_C.png``,
  ``per_concept.png`` (last round) and ``data_summary.png``;
- ``algorithms_over_rounds.png``: validation global accuracy and concept ARI of the four
  algorithms over the rounds, and ``concept_shares_by_algorithm.png``, each one's last concept
  shares.

    python benchmarks/docs_figures.py            # about 2 min on 2 cores
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

import lightning_fedcluster as lf  # noqa: E402
from lightning_fedcluster.callbacks import DataSummary  # noqa: E402
from lightning_fedcluster.datamodules import DigitsFederated  # noqa: E402
from lightning_fedcluster.models import MLPClassifier  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import set_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = {
    "FedRC": lambda: lf.FedRCStrategy(3, clients_per_round=10, local_steps=5, seed=0),
    "FedEM": lambda: lf.FedEMStrategy(3, clients_per_round=10, local_steps=5, seed=0),
    "IFCA": lambda: lf.IFCAStrategy(3, clients_per_round=10, local_steps=5, seed=0),
    "FedAvg": lambda: lf.FedAvgStrategy(clients_per_round=10, local_steps=5, seed=0),
}
IMAGES = {
    "clusters/omega_clients_by_concept": "omega_clients_by_concept.png",
    "clusters/concept_shares": "concept_shares.png",
    "clusters/label_stats_C": "label_stats_C.png",
    "val/per_concept": "per_concept.png",
    "data/summary": "data_summary.png",
}


def run(name: str, root: Path, rounds: int) -> EventAccumulator:
    """The main job with ``name``'s strategy, fit then tested; its event files, loaded."""
    logger = TensorBoardLogger(str(root), name=name, default_hp_metric=False)
    trainer = pl.Trainer(
        strategy=ALGORITHMS[name](), accelerator="cpu", devices=1, max_epochs=rounds,
        check_val_every_n_epoch=25, num_sanity_val_steps=0, logger=logger, callbacks=[DataSummary()],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        log_every_n_steps=1,
    )  # fmt: skip
    dm = DigitsFederated(num_clients=30, concepts=3, dirichlet_alpha=1.0, seed=0)
    pl.seed_everything(0, verbose=False)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
    trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


def series(events: EventAccumulator, tag: str) -> tuple[list[int], list[float]]:
    points = events.Scalars(tag)
    return [p.step for p in points], [p.value for p in points]


def scalars_figure(events: EventAccumulator) -> plt.Figure:
    """FedRC's scalars in four panels, the round on every x axis (as in TensorBoard)."""
    fig, axes = plt.subplots(2, 2, figsize=(9.0, 5.6), dpi=100, layout="constrained")
    ax = axes[0, 0]
    ax.plot(*series(events, "train/loss"), color="tab:blue")
    ax.set(title="train/loss", xlabel="round")
    ax = axes[0, 1]
    for tag, colour in (("val/local_acc", "tab:green"), ("val/global_acc", "tab:orange")):
        ax.plot(*series(events, tag), marker="o", color=colour, label=tag)
    for tag, colour in (("test/local_acc", "tab:green"), ("test/global_acc", "tab:orange")):
        ax.scatter(*series(events, tag), marker="*", s=120, color=colour, label=tag, zorder=3)
    ax.plot(*series(events, "train/acc"), color="tab:blue", alpha=0.5, label="train/acc")
    ax.set(title="accuracy", xlabel="round", ylim=(0, 1))
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[1, 0]
    ax.plot(*series(events, "val/concept_ari"), marker="o", color="tab:purple", label="val/concept_ari")
    ax.scatter(*series(events, "test/concept_ari"), marker="*", s=120, color="tab:purple",
               label="test/concept_ari", zorder=3)  # fmt: skip
    ax.set(title="concept ARI", xlabel="round", ylim=(-0.1, 1.05))
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[1, 1]
    tags = sorted(t for t in events.Tags()["scalars"] if t.startswith("clusters/concept"))
    for tag in tags:
        concept, cluster = tag.removeprefix("clusters/concept").split("_share_in_cluster")
        style = ("-", "--", ":")[int(cluster) % 3]
        ax.plot(*series(events, tag), linestyle=style, color=f"C{concept}", label=f"c{concept}→k{cluster}")
    ax.set(title="clusters/concept{c}_share_in_cluster{k}", xlabel="round", ylim=(0, 1))
    ax.legend(fontsize=6, ncol=3, loc="center right")
    return fig


def algorithms_figure(runs: dict[str, EventAccumulator]) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.2), dpi=100, layout="constrained")
    for i, (name, events) in enumerate(runs.items()):
        for ax, tag in zip(axes, ("val/global_acc", "val/concept_ari"), strict=True):
            ax.plot(*series(events, tag), marker="o", color=f"C{i}", label=name)
    axes[0].set(title="val/global_acc (unseen clients)", xlabel="round", ylim=(0, 1))
    axes[1].set(title="val/concept_ari", xlabel="round", ylim=(-0.1, 1.05))
    axes[0].legend(fontsize=8, loc="lower right")
    return fig


def shares_by_algorithm(runs: dict[str, EventAccumulator]) -> plt.Figure:
    """Each algorithm's concept x cluster shares at the last round (the final scalars)."""
    fig, axes = plt.subplots(1, len(runs), figsize=(9.0, 2.6), dpi=100, layout="constrained")
    for ax, (name, events) in zip(axes, runs.items(), strict=True):
        tags = [t for t in events.Tags()["scalars"] if t.startswith("clusters/concept")]
        pairs = [t.removeprefix("clusters/concept").split("_share_in_cluster") for t in tags]
        concepts, clusters = 1 + max(int(c) for c, _ in pairs), 1 + max(int(k) for _, k in pairs)
        shares = torch.zeros(concepts, clusters)
        for tag, (c, k) in zip(tags, pairs, strict=True):
            shares[int(c), int(k)] = events.Scalars(tag)[-1].value
        ax.imshow(shares.numpy(), vmin=0, vmax=1, cmap="Blues", aspect="auto")
        for (c, k), value in (
            (ck, float(v))
            for ck, v in zip(
                torch.cartesian_prod(torch.arange(concepts), torch.arange(clusters)).tolist(),
                shares.flatten(),
                strict=True,
            )
        ):
            ax.text(k, c, f"{value:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if value > 0.6 else "black")  # fmt: skip
        ax.set(title=name, xlabel="cluster", xticks=range(clusters), yticks=range(concepts))
        ax.set_ylabel("concept" if ax is axes[0] else "")
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "figures"), help="folder of the PNGs")
    parser.add_argument("--rounds", type=int, default=150, help="rounds of every run (the main job: 150)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    set_threads(1)  # with OMP_NUM_THREADS, or the launcher resets it to the cores
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        runs = {name: run(name, Path(root), args.rounds) for name in ALGORITHMS}
        fedrc = runs["FedRC"]
        for tag, file in IMAGES.items():
            (out / file).write_bytes(fedrc.Images(tag)[-1].encoded_image_string)
        written = list(IMAGES.values())
        for file, figure in (
            ("tensorboard_scalars.png", scalars_figure(fedrc)),
            ("algorithms_over_rounds.png", algorithms_figure(runs)),
            ("concept_shares_by_algorithm.png", shares_by_algorithm(runs)),
        ):
            figure.savefig(out / file)
            plt.close(figure)
            written.append(file)
        print(f"{'algorithm':<8} {'test/local_acc':>15} {'test/global_acc':>16} {'test/concept_ari':>17}")
        for name, events in runs.items():
            values = [
                events.Scalars(f"test/{m}")[-1].value for m in ("local_acc", "global_acc", "concept_ari")
            ]
            print(f"{name:<8} {values[0]:>15.3f} {values[1]:>16.3f} {values[2]:>17.3f}")
    print(f"wrote {', '.join(written)} to {out} in {time.perf_counter() - started:.0f} s")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"torch {torch.__version__}")  # fmt: skip


if __name__ == "__main__":
    main()
