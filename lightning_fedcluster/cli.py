"""``fedcluster``: the LightningCLI entry point.

``fedcluster fit`` with no arguments is the main job: FedRC with three clusters on DigitsFederated
(scikit-learn's digits, three concepts, label and feature shift), then a test pass that prints
local accuracy, global accuracy and concept ARI, and where the TensorBoard logs are. Every
default can be overridden on the command line or with ``--config``, as with any LightningCLI.
"""

from __future__ import annotations

import math
import sys

from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI

from lightning_fedcluster.datamodules import FederatedDataModule

MAIN_JOB_DEFAULTS = {
    "model": {"class_path": "lightning_fedcluster.models.MLPClassifier", "init_args": {"lr": 0.2}},
    "data": {
        "class_path": "lightning_fedcluster.datamodules.DigitsFederated",
        "init_args": {"num_clients": 30, "concepts": 3, "dirichlet_alpha": 1.0, "seed": 0},
    },
    "trainer.strategy": {
        "class_path": "lightning_fedcluster.FedRCStrategy",
        "init_args": {"num_clusters": 3, "clients_per_round": 10, "local_steps": 5, "seed": 0},
    },
    "trainer.max_epochs": 150,
    "trainer.check_val_every_n_epoch": 25,
    "trainer.num_sanity_val_steps": 0,
    "trainer.enable_model_summary": False,
}

RESULT_ROWS = (
    ("local accuracy", "test/local_acc"),
    ("global accuracy", "test/global_acc"),
    ("concept ARI", "test/concept_ari"),
)


def results_table(metrics: dict[str, float], log_dir: str | None) -> str:
    """The closing summary of a run, as printed by ``fedcluster fit``."""
    lines = ["", f"{'metric':<18}{'value':>8}", "-" * 26]
    for label, key in RESULT_ROWS:
        value = metrics.get(key, math.nan)
        lines.append(f"{label:<18}{value:>8.3f}")
    concept_rows = sorted(k for k in metrics if k.startswith("test/global_acc_concept"))
    for key in concept_rows:
        lines.append(f"{'  ' + key.removeprefix('test/global_acc_'):<18}{metrics[key]:>8.3f}")
    lines.append("")
    if log_dir:
        lines.append(f"TensorBoard logs: {log_dir}   (view with: tensorboard --logdir {log_dir})")
    return "\n".join(lines)


class FedClusterCLI(LightningCLI):
    """LightningCLI whose defaults are the main job and whose ``fit`` ends with a test pass."""

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        parser.set_defaults(MAIN_JOB_DEFAULTS)

    def after_fit(self) -> None:
        trainer = self.trainer
        results = trainer.test(trainer.lightning_module, datamodule=self.datamodule, verbose=False)
        if trainer.is_global_zero:
            log_dir = trainer.logger.log_dir if trainer.logger is not None else None
            print(results_table(results[0] if results else {}, log_dir), flush=True)


def run_cli(args: list[str] | None = None) -> FedClusterCLI:
    """Build and run the CLI on ``args`` (default: the command line); returns it for inspection."""
    return FedClusterCLI(
        LightningModule,
        FederatedDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        args=sys.argv[1:] if args is None else args,
        save_config_kwargs={"overwrite": True},
    )


def main() -> None:
    """Console entry point (``fedcluster``)."""
    run_cli()


if __name__ == "__main__":
    main()
