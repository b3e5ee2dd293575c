"""``fedcluster``: the LightningCLI entry point.

``fedcluster fit`` with no arguments is the main job: FedRC with three clusters on DigitsFederated
(scikit-learn's digits, three concepts, label and feature shift), then a test pass that prints
local accuracy, global accuracy and concept ARI, and where the logs are. Every default can be
overridden on the command line or with ``--config``, as with any LightningCLI. The console shows
a progress bar over rounds (RoundProgressBar), the data scenario is logged at fit start
(DataSummary) and a checkpoint is written at every round end (ModelCheckpoint), unless the
configuration lists its own. A fit stopped by SIGTERM exits with status 143.

Beyond LightningCLI: ``--model mymodels.MyNet`` finds ``mymodels.py`` in the working directory;
``--data my_data.pt`` (or ``.npz``) builds the FedRC scenario from the file's (x, y) tensors
(``TensorFileFederated``, flags ``--data.num_clients``, ``--data.image_shape=[1,8,8]``, ...);
``--figures=false`` draws no figures. A convolutional model given flat inputs fails before
training with the option that gives it images (``engine/setup_checks.py``, on every path). A bad
argument, class name or ``--data`` file is reported in a line or two, the cause first
(``cli_errors``); ``FEDCLUSTER_DEBUG=1`` shows the full report.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from lightning_fedcluster.callbacks import ClusterMonitor, DataSummary, RoundProgressBar
from lightning_fedcluster.cli_errors import ConciseArgumentParser, debug_requested, exit_with, summarize
from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.datamodules.datasets.tensor_file import TENSOR_FILE_SUFFIXES
from lightning_fedcluster.strategies import check_strategy_name, registered_name

MAIN_JOB_DEFAULTS = {
    "model": {"class_path": "lightning_fedcluster.models.MLPClassifier", "init_args": {"lr": 0.2}},
    "data": {
        "class_path": "lightning_fedcluster.datamodules.DigitsFederated",
        "init_args": {"num_clients": 30, "concepts": 3, "dirichlet_alpha": 1.0, "seed": 0},
    },
    # The robust concept grouping after round 20 (the take-off study, benchmarks/results/takeoff.md):
    # the plain grouping left no dead cluster on six seeds (global accuracy 0.905 against 0.753
    # without it); the mean assignment, the margin, a 10-round hold and the late pass 0.911 (the
    # take-off cells' best); the server weighing copies by ω from the grouping on, with each copy's
    # local gradient clipped at norm 5 (a loss spike's guard: five of six seeds end as without it),
    # 0.923, higher on each seed.
    "trainer.strategy": {
        "class_path": "lightning_fedcluster.FedRCStrategy",
        "init_args": {
            "num_clusters": 3,
            "clients_per_round": 10,
            "local_steps": 5,
            "seed": 0,
            "config": {
                "group_round": 20,
                "group_assign": "mean",
                "group_margin": 0.7,
                "group_hold": 10,
                "group_late_round": 25,
                "omega_weighting_from": 20,
            },
            "gradient_clip_val": 5.0,
        },
    },
    "trainer.max_epochs": 150,
    "trainer.check_val_every_n_epoch": 25,
    "trainer.num_sanity_val_steps": 0,
    "trainer.enable_model_summary": False,
    # The engine logs once per round (step = round): a round is one batch, fewer than Lightning's
    # default per-step logging interval, which would otherwise warn about it.
    "trainer.log_every_n_steps": 1,
}

TENSOR_FILE_DATA = "lightning_fedcluster.datamodules.TensorFileFederated"
DATA_HELP = (
    "A FederatedDataModule: a class name or class_path with its arguments (--data.ARG VALUE), or a "
    ".pt / .npz file of (x, y) tensors, which builds the FedRC scenario from them (TensorFileFederated: "
    "--data.num_clients, --data.concepts, --data.dirichlet_alpha, --data.corrupt_fraction, "
    "--data.image_shape=[C,H,W] to serve flat rows as images, --data.channels_last, ...; all: "
    "--data.help TensorFileFederated)."
)
FIGURES_HELP = (
    "Draw figures (cluster weights, concept shares, accuracy per concept, data summary) for "
    "TensorBoard at validation rounds and the last round; false: scalars only."
)

ONE_CONCEPT = (
    "(undefined: the clients share one concept, so there is no grouping to recover; "
    "--data.concepts 3 builds the FedRC scenario with three)"
)
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
        if key == "test/concept_ari" and math.isnan(value):
            lines.append(f"{label:<18}{'n/a':>8}   {ONE_CONCEPT}")
            continue
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


def _with_tensor_file_data(args: list[str]) -> list[str]:
    """``args`` with ``--data FILE.pt`` / ``--data=FILE.npz`` replaced by the TensorFileFederated
    class and its ``path`` argument."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        value = None
        if arg == "--data" and i + 1 < len(args):
            value, step = args[i + 1], 2
        elif arg.startswith("--data="):
            value, step = arg.removeprefix("--data="), 1
        if value is not None and Path(value).suffix.lower() in TENSOR_FILE_SUFFIXES:
            out += ["--data", TENSOR_FILE_DATA, "--data.path", value]
            i += step
            continue
        out.append(arg)
        i += 1
    return out


class FedClusterCLI(LightningCLI):
    """LightningCLI whose defaults are the main job and whose ``fit`` ends with a test pass.

    A model class named on the command line or in a config starts from its own defaults: the
    main job's model arguments (MLPClassifier's ``hidden``, ``lr`` = 0.2) are not carried into it.
    """

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Lightning's parser; the root's and the subcommands' share one ``family`` list, where
        an unknown option's "did you mean" looks (``cli_errors.option_names``)."""
        parser = super().init_parser(**kwargs)
        if not hasattr(self, "parser_family"):
            self.parser_family: list[LightningArgumentParser] = []
        self.parser_family.append(parser)
        parser.family = self.parser_family
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(MAIN_JOB_DEFAULTS)
        parser.add_argument("--figures", type=bool, default=True, help=FIGURES_HELP)
        self._job_parsers = [*getattr(self, "_job_parsers", []), parser]

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse; ``--data FILE`` becomes TensorFileFederated, and when the arguments name another
        model or data class, that class becomes the default first.

        jsonargparse keeps a default's ``init_args`` that type-check for a newly given class_path,
        so the main job's MLPClassifier (DigitsFederated) arguments would otherwise land in the
        user's class.
        """
        from_command_line = args is None
        argv = sys.argv[1:] if from_command_line else args
        if isinstance(argv, list):
            argv = _with_tensor_file_data(argv)
            if from_command_line:  # LightningCLI warns when given args besides a command line
                sys.argv[1:] = argv
            else:
                args = argv
        for key, class_path in self._chosen_classes(parser, argv).items():
            for job_parser in self._job_parsers:
                job_parser.set_defaults({key: {"class_path": class_path}})
        super().parse_arguments(parser, args)

    @staticmethod
    def _chosen_classes(parser: LightningArgumentParser, args: ArgsType) -> dict[str, str]:
        """The model and data class_paths the arguments choose, where they are not the main job's."""
        if not isinstance(args, list) or not any(
            a.startswith(("--model", "--data", "--config", "-c")) for a in args
        ):
            return {}
        config = parser.parse_args(_without_print_config(args))
        subcommand = config.get("subcommand")
        chosen = {}
        for key in ("model", "data"):
            class_path = getattr((config[subcommand] if subcommand else config).get(key), "class_path", None)
            if class_path is not None and class_path != MAIN_JOB_DEFAULTS[key]["class_path"]:
                chosen[key] = class_path
        return chosen

    def instantiate_classes(self) -> None:
        """Build the configured classes; an error doing so (a bad --data file, a strategy name,
        an argument the class refuses) is reported in a line or two with the library's own
        message first (``cli_errors``), the traceback only with FEDCLUSTER_DEBUG=1."""
        try:
            super().instantiate_classes()
        except Exception as error:
            if debug_requested():
                raise
            exit_with(summarize(str(error)))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with a DataSummary and a RoundProgressBar unless the configuration has its
        own (or turns progress bars off), and a ModelCheckpoint that saves at every round end
        unless it has its own (or turns checkpointing off): Lightning's default one saves only
        after a validation, which the main job runs every 25 rounds."""
        subcommand = self.config_init[self.subcommand] if self.subcommand else self.config_init
        config = subcommand["trainer"]
        if "strategy" in config:  # a class name alone: the class with its defaults (its registered name)
            config["strategy"] = registered_name(config["strategy"])
        check_strategy_name(config.get("strategy"))
        given = config.get("callbacks") or []
        callbacks = list(given) if isinstance(given, list) else [given]
        figures = subcommand.get("figures", True)
        if not any(isinstance(c, DataSummary) for c in callbacks):
            callbacks.append(DataSummary(figures=figures))
        if not figures:  # --figures=false wins over the configured callbacks' own setting
            for callback in callbacks:
                if isinstance(callback, (ClusterMonitor, DataSummary)):
                    callback.figures = False
            if not any(isinstance(c, ClusterMonitor) for c in callbacks):
                callbacks.append(ClusterMonitor(figures=False))
        if config.get("enable_checkpointing") is not False and not any(
            isinstance(c, ModelCheckpoint) for c in callbacks
        ):
            callbacks.append(ModelCheckpoint(save_on_train_epoch_end=True))
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
        # How --data takes a file, at the end of each subcommand's --help.
        parser_kwargs={name: {"epilog": f"--data: {DATA_HELP}"} for name in LightningCLI.subcommands()},
        parser_class=ConciseArgumentParser,
    )


def main() -> None:
    """Console entry point (``fedcluster``). The working directory is importable, as under
    ``python -m``, so ``--model mymodels.MyNet`` finds ``./mymodels.py``. ``fedcluster flower ...``
    is the Flower deployment's commands (``lightning_fedcluster.flower.commands``)."""
    if sys.argv[1:2] == ["flower"]:
        from lightning_fedcluster.flower.commands import main as flower

        sys.exit(flower(sys.argv[2:]))
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    run_cli()


if __name__ == "__main__":
    main()
