"""Train FedRC on DigitsFederated and save the final weights, client state and, per process,
the clients that process simulated. Used by the multi-process tests (run as a script so that
Lightning's subprocess launcher can start the other ranks)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings

import lightning.pytorch as pl
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from lightning_fedcluster.prediction import concat_predictions
from lightning_fedcluster.strategies.round_arguments import Execution
from tests.helpers.mechanisms import EVERY_MECHANISM


def docs_example() -> dict:
    """The rules defined on the docs' "Adding an algorithm" page, run as written."""
    from tests.docs.test_new_algorithm import _example

    return _example()


class RecordClients(pl.Callback):
    """Remembers which (round, client) pairs this process simulated."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.seen.extend(pl_module.round_executor.trained)  # the round's clients this process trained


class PlateauMLP(MLPClassifier):
    """An MLP whose lr halves whenever the round's training loss does not rise: a schedule driven
    by an all-reduced round metric, which every process must step alike."""

    def configure_optimizers(self):  # noqa: ANN201
        optimizer = super().configure_optimizers()
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": plateau, "monitor": "train/loss"}


STRATEGIES = {
    "fedrc": lambda cpr: lf.FedRCStrategy(3, clients_per_round=cpr, local_steps=3),
    "fedrc_options": lambda cpr: lf.FedRCStrategy(
        4,
        clients_per_round=cpr,
        local_steps=3,
        config=FedRC.Config(adam_gamma=True, removal_threshold=0.2, label_noise_std=0.1),
        shared_layers=("net.0",),
        finetune_epochs=1,
    ),
    "fedrc_persist": lambda cpr: lf.FedRCStrategy(
        3, clients_per_round=cpr, local_steps=3, optimizer_state="persist"
    ),
    "fedrc_persist_file": lambda cpr: lf.FedRCStrategy(
        3,
        clients_per_round=cpr,
        local_steps=3,
        optimizer_state="persist",
        optimizer_state_dir=tempfile.gettempdir(),
    ),
    "fedrc_plateau": lambda cpr: lf.FedRCStrategy(3, clients_per_round=cpr, local_steps=3),
    "fedrc_bf16": lambda cpr: lf.FedRCStrategy(3, clients_per_round=cpr, local_steps=3),
    "fedrc_server_adam": lambda cpr: lf.FedRCStrategy(
        3, clients_per_round=cpr, local_steps=3, server_optimizer="adam", server_lr=0.05
    ),
    "fedrc_grouping": lambda cpr: lf.FedRCStrategy(
        4,
        clients_per_round=cpr,
        local_steps=3,
        config=EVERY_MECHANISM,
        gradient_clip_val=0.5,
    ),
    "fedrc_discovery": lambda cpr: lf.FedRCStrategy(
        5, discovery=lf.ConceptDiscovery(), clients_per_round=cpr, local_steps=3
    ),
    "fedrc_retire": lambda cpr: lf.FedRCStrategy(
        6, clients_per_round=cpr, local_steps=3, config=FedRC.Config(retire_after=1),
    ),
    "fedrc_reseed": lambda cpr: lf.FedRCStrategy(
        3,
        clients_per_round=cpr,
        local_steps=3,
        config=FedRC.Config(reseed_threshold=0.34),
        optimizer_state="persist",
    ),
    "fedrc_reuse": lambda cpr: lf.FedRCStrategy(
        3, clients_per_round=cpr, local_steps=3, reuse_estep_forward=True
    ),
    "fedem": lambda cpr: lf.FedEMStrategy(3, clients_per_round=cpr, local_steps=3),
    "dfedem": lambda cpr: lf.DFedEMStrategy(3, local_steps=3),
    "ifca": lambda cpr: lf.IFCAStrategy(3, clients_per_round=cpr, local_steps=3),
    "fesem": lambda cpr: lf.FeSEMStrategy(3, clients_per_round=cpr, local_steps=3),
    "wecfl": lambda cpr: lf.WeCFLStrategy(3, clients_per_round=cpr, local_steps=3),
    "fedsoft": lambda cpr: lf.FedSoftStrategy(3, selection_size=3, local_steps=3),
    "cfl": lambda cpr: lf.CFLStrategy(3, local_steps=3, eps1=1e6, eps2=1e-6),
    # The docs' one-file merge rule (docs/how-to/new-algorithm.md); ε = 10 merges a pair every round.
    "fedrc_merge": lambda cpr: lf.FederatedStrategy(
        algorithm=docs_example()["MergingFedRC"](3, epsilon=10.0), clients_per_round=cpr, local_steps=3
    ),
    "fedavg": lambda cpr: lf.FedAvgStrategy(clients_per_round=cpr, local_steps=3),
    "fedprox": lambda cpr: lf.FedProxStrategy(mu=0.1, clients_per_round=cpr, local_steps=3),
}
PRECISION = {"fedrc_bf16": "bf16-mixed"}  # Trainer(precision=...) of a run, "32-true" if not named


def train(name: str, executor: str, args: argparse.Namespace, out: str) -> None:
    """Fit strategy ``name`` on the given executor, test it, and write its results under ``out``."""
    recorder = RecordClients()
    strategy = STRATEGIES[name](args.clients_per_round)
    # A frozen group, replaced whole; the run's own reuse_estep_forward is kept.
    reuse = strategy.execution.reuse_estep_forward
    strategy.execution = Execution(executor, args.clients_per_chunk, None, reuse)
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.rounds,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[recorder],
        precision=PRECISION.get(name, "32-true"),
    )
    datamodule = DigitsFederated(num_clients=12, seed=0)
    momentum = (
        0.5 if name in ("fedrc_persist", "fedrc_persist_file", "fedrc_reseed") else 0.0
    )  # persistent state needs momentum
    model_type = PlateauMLP if name == "fedrc_plateau" else MLPClassifier
    trainer.fit(model_type(lr=0.2, momentum=momentum), datamodule=datamodule)
    metrics = trainer.test(trainer.lightning_module, datamodule=datamodule, verbose=False)[0]
    os.makedirs(out, exist_ok=True)
    if name == "fedrc":  # each process's share of trainer.predict (the test joins them)
        predictions = concat_predictions(trainer.predict(trainer.lightning_module, datamodule=datamodule))
        torch.save(predictions, os.path.join(out, f"predictions_rank{trainer.global_rank}.pt"))
    with open(os.path.join(out, f"clients_rank{trainer.global_rank}.json"), "w") as f:
        json.dump(recorder.seen, f)
    if trainer.is_global_zero:
        with open(os.path.join(out, "executor.txt"), "w") as f:
            f.write(trainer.lightning_module.executor)
        module = trainer.lightning_module
        torch.save(
            {
                "weights": module.state_dict(),
                "client_state": module.client_state.state_dict(),
                "metrics": metrics,
                "server_optimizer": {} if module.server_optimizer is None else module.server_optimizer.state,
            },
            os.path.join(out, "result.pt"),
        )


def main() -> None:
    """Train every run named by ``--runs`` (``strategy`` or ``strategy:executor``) one after the
    other in this process (and its ranks), writing each under ``--out/<run>``: one process start
    serves every strategy."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", nargs="+", default=["fedrc"])
    parser.add_argument("--clients-per-chunk", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    for run in args.runs:
        name, _, executor = run.partition(":")
        if name not in STRATEGIES or executor not in ("", "auto", "loop", "vectorized"):
            parser.error(f"unknown run {run!r}: use one of {sorted(STRATEGIES)}[:auto|loop|vectorized]")
        train(name, executor or "auto", args, os.path.join(args.out, run.replace(":", "@")))


if __name__ == "__main__":
    main()
