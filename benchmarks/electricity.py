"""FedRC App. I.1 (Table 3): Electricity with FedAvg, IFCA and FedRC, as examples/electricity.yaml.

Data: the standard ``elec.csv`` (45 312 half-hour rows of the NSW market; columns period,
nswprice, nswdemand, vicprice, vicdemand, transfer, class). Two concepts: the rows before and
after row 26 640, where Tahmasbi et al. (2021, DriftSurf) place Electricity's drift (batch 20 of
34 batches of 1 332 rows); one class-balanced global test client per concept (20 % of its rows);
the rest pooled and split over 300 clients by LDA with alpha = 0.1; each client keeps 10 % for
test. The authors' model and optimiser: MLP 6-12-12-2, SGD lr 0.01, momentum 0.9, weight decay
5e-4, batch 128, one local epoch per round, every client every round, K = 3, per-(client,
cluster) optimizer state kept across rounds. Global clients fit their mixture weights on 40 % of
their rows and are scored on the other 60 % (the authors' split for this data set).

Prints, per algorithm, the last round's test accuracies and the test accuracy at the round with
the best validation global accuracy (validation every ``--every`` rounds), plus a central MLP
trained on all client rows (is there a conflict a single model cannot fit?).

    OMP_NUM_THREADS=1 python benchmarks/electricity.py --path data/elec.csv --rounds 500
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from _common import machine_line, make_trainer, quiet
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import CSVFederated
from lightning_fedcluster.models import MLPClassifier

FEATURES = ["period", "nswprice", "nswdemand", "vicprice", "vicdemand", "transfer"]
ALGORITHMS = {
    "FedAvg": lambda seed: lf.FedAvgStrategy(**COMMON, seed=seed),
    "IFCA K=3": lambda seed: lf.IFCAStrategy(3, **COMMON, seed=seed),
    "FedRC K=3": lambda seed: lf.FedRCStrategy(3, **COMMON, seed=seed),
}
COMMON = dict(clients_per_round=None, local_steps=None, local_epochs=1, optimizer_state="persist")


def datamodule(path: str, seed: int) -> CSVFederated:
    return CSVFederated(
        path,
        label_column="class",
        feature_columns=FEATURES,
        drift_rows=[26640],
        num_clients=300,
        dirichlet_alpha=0.1,
        mix_segments=True,
        global_test_fraction=0.2,
        test_fraction=0.1,
        standardize=False,
        batch_size=128,
        seed=seed,
        adapt_fraction=0.4,
    )


def model() -> MLPClassifier:
    return MLPClassifier(
        in_features=6, num_classes=2, hidden=(12, 12), lr=0.01, momentum=0.9, weight_decay=5e-4
    )


def central(dm: CSVFederated, epochs: int = 30) -> list[float]:
    """One MLP trained on every client's training rows; its accuracy on each global client."""
    torch.manual_seed(0)
    net = model().net
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    x, y = dm.train_x, dm.train_y
    for _ in range(epochs):
        for rows in torch.randperm(len(y)).split(128):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
            optimizer.step()
    with torch.no_grad():
        return [float((net(gx).argmax(1) == gy).float().mean()) for gx, gy in map(dm.global_split, range(2))]


def run(name: str, dm: CSVFederated, rounds: int, every: int, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        best = ModelCheckpoint(dirpath=folder, monitor="val/global_acc", mode="max", save_top_k=1)
        trainer = make_trainer(
            ALGORITHMS[name](seed),
            rounds,
            validate=False,
            callbacks=[best],
            enable_checkpointing=True,
            limit_val_batches=None,
            check_val_every_n_epoch=every,
        )
        start = time.perf_counter()
        trainer.fit(model(), datamodule=dm)
        seconds = time.perf_counter() - start
        last = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
        chosen = trainer.test(trainer.lightning_module, datamodule=dm, ckpt_path="best", verbose=False)[0]
        best_round = int(torch.load(best.best_model_path, weights_only=False)["epoch"]) + 1
    return {
        "last_global": last["test/global_acc"],
        "last_c0": last["test/global_acc_concept0"],
        "last_c1": last["test/global_acc_concept1"],
        "last_local": last["test/local_acc"],
        "best_val_round": best_round,
        "best_global": chosen["test/global_acc"],
        "s_per_round": seconds / rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="data/elec.csv")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--every", type=int, default=25, help="validate every this many rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    args = parser.parse_args()
    quiet()
    dm = datamodule(args.path, args.seed)
    print(machine_line(), flush=True)
    sizes = dm.train_sizes
    print(
        f"clients {dm.num_clients}, train rows median {int(sizes.median())}, max {int(sizes.max())}; "
        f"global clients {[int(dm.global_split(g)[1].numel()) for g in range(2)]}",
        flush=True,
    )
    print(
        f"central MLP on all client rows: accuracy on global client 0 / 1 = "
        f"{' / '.join(f'{a:.3f}' for a in central(dm))}",
        flush=True,
    )
    columns = (
        "last_global",
        "last_c0",
        "last_c1",
        "last_local",
        "best_val_round",
        "best_global",
        "s_per_round",
    )
    print("| algorithm | " + " | ".join(columns) + " |\n" + "|---" * (len(columns) + 1) + "|", flush=True)
    for name in args.algorithms:
        row = run(name, dm, args.rounds, args.every, args.seed)
        print(
            f"| {name} | "
            + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns)
            + " |",
            flush=True,
        )


if __name__ == "__main__":
    main()
