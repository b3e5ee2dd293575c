"""The take-off runs' per-round evaluation callback (``takeoff_runs.py``, ``fall_probe.py``):
what each recorded run keeps of every round."""

from __future__ import annotations

import statistics
from typing import Any


def make_evaluation(every: int, floor: float = 1e-8, name: str = "", true_models: bool = False):  # noqa: ANN201
    """A callback: each round's concept ARI, and every ``every`` rounds (and at the last) the global
    clients' accuracy per concept (with ``true_models`` also with ω one-hot at their concept's
    cluster, ``acc_true``: cluster k serves concept k in the ceiling runs, so this leaves out the
    global clients' own E-step) and the clients' mean accuracy on their own test rows; also the
    device the module trained on (read at train start, since teardown moves it to the CPU), and each
    client's largest-ω cluster (and with a hold, its held flag) every round. With merging on, each
    round also keeps the clients' merge scores and log C (``floor``: the run's label-statistics
    floor), so merge criteria can be studied offline."""
    import lightning.pytorch as pl
    import torch
    from authors_comparison import concept_ari

    from lightning_fedcluster.algorithms.mixture import label_statistics

    class Evaluation(pl.Callback):
        def __init__(self, global_clients: list) -> None:
            self.global_clients, self.rows = global_clients, []
            self.device = "unknown"

        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            # read during the fit: Lightning's teardown moves the module back to the CPU afterwards
            self.device = str(module.device)

        def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            state = module.client_state
            number = len(self.rows) + 1
            row: dict[str, Any] = {
                "round": number,
                "ari": concept_ari(state.omega, trainer.datamodule.metadata.concept, state.seen),
                "alive": int(state.active.sum()),
            }
            row["owner"] = state.omega.argmax(1).tolist()  # each client's largest-ω cluster
            if "group_held" in state.extra:  # the hold's flags: 1 grouped, 2 late pass, 3 released
                row["held"] = [int(flag) for flag in state.extra["group_held"].tolist()]
            if "cluster_scores" in state.extra:  # merging's per-client scores, for offline study
                row["scores"] = [[round(v, 4) for v in r] for r in state.extra["cluster_scores"].tolist()]
                c = label_statistics(state.label_sums[state.seen], floor)
                row["log_c"] = [[round(v, 4) for v in r] for r in c.log().tolist()]
            if number % every == 0 or number == trainer.max_epochs:
                for concept, xa, ya, xs_g, ys_g in self.global_clients:
                    omega = module.adapt(xa, ya)
                    predicted = module.predict_proba(xs_g, omega).argmax(1).cpu()
                    row[f"acc{concept}"] = float((predicted == ys_g).double().mean())
                    if true_models:
                        own = torch.zeros_like(omega)
                        own[concept] = 1.0
                        predicted = module.predict_proba(xs_g, own).argmax(1).cpu()
                        row[f"acc_true{concept}"] = float((predicted == ys_g).double().mean())
                dm = trainer.datamodule
                sizes = dm.test_offsets.diff()
                owner = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
                predicted = module.predict_proba(dm.test_x, client=owner).argmax(1).cpu()
                hits = (predicted == dm.test_y).double()
                per_client = torch.zeros(sizes.numel(), dtype=torch.float64).index_add_(0, owner, hits)
                per_client /= sizes.clamp(min=1).double()
                row["val"] = float(per_client.mean())
                # the global accuracy: mean over the concepts the clients hold
                held = trainer.datamodule.metadata.concept.unique().tolist()
                row["acc"] = statistics.mean(row[f"acc{c}"] for c in held)
                if true_models:
                    row["acc_true"] = statistics.mean(row[f"acc_true{c}"] for c in held)
            self.rows.append(row)
            if name:  # progress, one line a round
                line = f"{name} round {number}: ARI {row['ari']:.2f}, alive {row['alive']}"
                print(line + (f", acc {100 * row['acc']:.1f}" if "acc" in row else ""), flush=True)

    return Evaluation
