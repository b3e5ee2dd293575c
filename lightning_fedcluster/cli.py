"""``fedcluster``: the LightningCLI entry point.

``fedcluster fit`` with no arguments is the main job: FedRC with three clusters on DigitsFederated
(scikit-learn's digits, three concepts, label and feature shift), then a test pass that prints
local accuracy, global accuracy and concept ARI, and where the logs are. Every default can be
overridden on the command line or with ``--config``, as with any LightningCLI. The console shows
a progress bar over rounds (RoundProgressBar) and the data scenario is logged at fit start
(DataSummary), unless the configuration lists its own.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from lightning_fedcluster.callbacks import DataSummary, RoundProgressBar
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
    # The engine logs once per round (step = round), never per step: a round's work items need not
    # reach Lightning's per-step logging interval, which would otherwise warn that they do not.
    "trainer.log_every_n_steps": 1,
}

RESULT_ROWS = (
    ("local accuracy", "test/local_acc"),
    ("global accuracy", "test/global_acc"),
    ("concept ARI", "test/concept_ari"),
)


def log_location(logger: Logger) -> str:
    """Where ``logger`` wrote and how to look at it, in one line."""
    if isinstance(logger, TensorBoardLogger):
        return f"TensorBoard logs: {logger.log_dir}   (view with: tensorboard --logdir {logger.log_dir})"
    if isinstance(logger, CSVLogger):
        return f"CSV logs: {logger.log_dir}/metrics.csv"
    log_dir = getattr(logger, "log_dir", None)
    return f"{type(logger).__name__} logs" + (f": {log_dir}" if log_dir else "")


def results_table(metrics: dict[str, float], locations: list[str]) -> str:
    """The closing summary of a run, as printed by ``fedcluster fit``."""
    lines = ["", f"{'metric':<18}{'value':>8}", "-" * 26]
    for label, key in RESULT_ROWS:
        value = metrics.get(key, math.nan)
        lines.append(f"{label:<18}{value:>8.3f}")
    concept_rows = sorted(k for k in metrics if k.startswith("test/global_acc_concept"))
    for key in concept_rows:
        lines.append(f"{'  ' + key.removeprefix('test/global_acc_'):<18}{metrics[key]:>8.3f}")
    lines.append("")
    lines += locations
    return "\n".join(lines)


def _without_print_config(args: list[str]) -> list[str]:
    """``args`` minus ``--print_config`` and its optional flag value."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value and not arg.startswith("-"):
            skip_value = False
            continue
        skip_value = arg == "--print_config"
        if not arg.startswith("--print_config"):
            kept.append(arg)
    return kept


class FedClusterCLI(LightningCLI):
    """LightningCLI whose defaults are the main job and whose ``fit`` ends with a test pass.

    A model class named on the command line or in a config starts from its own defaults: the
    main job's model arguments (MLPClassifier's ``hidden``, ``lr`` = 0.2) are not carried into it.
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(MAIN_JOB_DEFAULTS)
        self._job_parsers = [*getattr(self, "_job_parsers", []), parser]

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse; when the arguments name another model class, make that class the default first.

        jsonargparse keeps a default's ``init_args`` that type-check for a newly given class_path,
        so the main job's MLPClassifier arguments would otherwise land in the user's class.
        """
        model = self._chosen_model(parser, args)
        if model is not None:
            for job_parser in self._job_parsers:
                job_parser.set_defaults({"model": {"class_path": model}})
        super().parse_arguments(parser, args)

    @staticmethod
    def _chosen_model(parser: LightningArgumentParser, args: ArgsType) -> str | None:
        """The model class_path the arguments choose, when it is not the main job's."""
        argv = sys.argv[1:] if args is None else args
        if not isinstance(argv, list) or not any(a.startswith(("--model", "--config", "-c")) for a in argv):
            return None
        config = parser.parse_args(_without_print_config(argv))
        subcommand = config.get("subcommand")
        chosen = (config[subcommand] if subcommand else config).get("model")
        class_path = getattr(chosen, "class_path", None)
        return None if class_path == MAIN_JOB_DEFAULTS["model"]["class_path"] else class_path

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with a DataSummary and a RoundProgressBar unless the configuration has its
        own (or turns progress bars off)."""
        subcommand = self.config_init[self.subcommand] if self.subcommand else self.config_init
        config = subcommand["trainer"]
        given = config.get("callbacks") or []
        callbacks = list(given) if isinstance(given, list) else [given]
        if not any(isinstance(c, DataSummary) for c in callbacks):
            callbacks.append(DataSummary())
        bars_on = config.get("enable_progress_bar") is not False
        if bars_on and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(RoundProgressBar())
        return super().instantiate_trainer(**{**kwargs, "callbacks": callbacks})

    def after_fit(self) -> None:
        trainer = self.trainer
        results = trainer.test(trainer.lightning_module, datamodule=self.datamodule, verbose=False)
        if trainer.is_global_zero:
            if trainer.fast_dev_run:
                locations = ["fast_dev_run: nothing was logged or checkpointed."]
            else:
                locations = [log_location(logger) for logger in trainer.loggers] or [
                    "No logger: nothing was logged."
                ]
            print(results_table(results[0] if results else {}, locations), flush=True)


def run_cli(args: ArgsType = None) -> FedClusterCLI:
    """Build and run the CLI on ``args`` (default: the command line); returns it for inspection."""
    return FedClusterCLI(
        LightningModule,
        FederatedDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        args=args,
        save_config_kwargs={"overwrite": True},
    )


def main() -> None:
    """Console entry point (``fedcluster``)."""
    run_cli()


if __name__ == "__main__":
    main()
