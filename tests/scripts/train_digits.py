"""Train FedRC on DigitsFederated and save the final weights, client state and, per process,
the clients that process simulated. Used by the multi-process tests (run as a script so that
Lightning's subprocess launcher can start the other ranks)."""

from __future__ import annotations

import argparse
import json
import os
import warnings

import lightning.pytorch as pl
import torch

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier


class RecordClients(pl.Callback):
    """Remembers which (round, client) pairs this process simulated."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if batch["client"] >= 0 and batch["step"] == 0:
            self.seen.append((batch["round"], batch["client"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    recorder = RecordClients()
    trainer = pl.Trainer(
        strategy=FedRCStrategy(num_clusters=3, clients_per_round=args.clients_per_round, local_steps=3),
        accelerator="cpu", devices=args.devices, max_epochs=args.rounds, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[recorder],
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=12, seed=0))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"clients_rank{trainer.global_rank}.json"), "w") as f:
        json.dump(recorder.seen, f)
    if trainer.is_global_zero:
        module = trainer.lightning_module
        torch.save({"weights": module.state_dict(), "client_state": module.client_state.state_dict()},
                   os.path.join(args.out, "result.pt"))


if __name__ == "__main__":
    main()
