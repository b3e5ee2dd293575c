"""cli.py: the ``fedcluster`` command: defaults are the main job; ``fit`` ends with the results table;
a user's model and data files (.pt / .npz) from the command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_fedcluster import ConceptDiscovery
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.callbacks import ClusterMonitor, DataSummary, RoundProgressBar
from lightning_fedcluster.cli import MAIN_JOB_DEFAULTS, FedClusterCLI, log_location, run_cli
from lightning_fedcluster.datamodules import DigitsFederated, FederatedDataModule, TensorFileFederated
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.models import SmallCNN
from lightning_fedcluster.strategies import IFCAStrategy

ROOT = Path(__file__).parent.parent


def test_fit_prints_the_results_table_and_writes_tensorboard_logs(tmp_path, capsys):
    cli = run_cli(
        [
            "fit",
            "--trainer.max_epochs=3",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
            "--data.init_args.num_clients=10",
        ]
    )
    out = capsys.readouterr().out
    for row in ("local accuracy", "global accuracy", "concept ARI", "TensorBoard logs:"):
        assert row in out
    log_dir = Path(cli.trainer.logger.log_dir)
    assert log_dir.is_relative_to(tmp_path)
    assert any(p.name.startswith("events.out.tfevents") for p in log_dir.iterdir())
    assert cli.trainer.strategy.num_clusters == 3 and cli.trainer.current_epoch == 3
    assert sum(isinstance(c, DataSummary) for c in cli.trainer.callbacks) == 1  # on by default
    assert not any(isinstance(c, ProgressBar) for c in cli.trainer.callbacks)  # progress bars off


def test_a_configured_data_summary_is_not_doubled_and_the_round_bar_is_the_default(tmp_path):
    summary = "--trainer.callbacks+=lightning_fedcluster.callbacks.DataSummary"
    cli = run_cli(
        [
            "fit",
            "--trainer.logger=false",
            summary,
            "--trainer.callbacks.print_table=true",
            "--trainer.max_epochs=1",
            "--data.init_args.num_clients=10",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    summaries = [c for c in cli.trainer.callbacks if isinstance(c, DataSummary)]
    assert len(summaries) == 1 and summaries[0].print_table
    assert [type(c) for c in cli.trainer.callbacks if isinstance(c, ProgressBar)] == [RoundProgressBar]


def test_console_script_exits_zero_and_help_lists_the_strategy(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "lightning_fedcluster.cli", "fit", "--print_config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lightning_fedcluster.FedRCStrategy" in done.stdout
    assert "DigitsFederated" in done.stdout
    assert MAIN_JOB_DEFAULTS["trainer.max_epochs"] == 150
    assert "group_round: 20" in done.stdout  # the quick start recommends the robust concept grouping
    options = ("group_assign: mean", "group_margin: 0.7", "group_hold: 10", "group_late_round: 25")
    for option in (*options, "omega_weighting_from: 20", "gradient_clip_val: 5.0"):
        assert option in done.stdout


class TinyNet(LightningModule):
    """A user's model whose __init__ shares names with MLPClassifier's (hidden, lr) but not types
    or defaults: the CLI must start it from these defaults, not the main job's."""

    def __init__(self, hidden: int = 7, lr: float = 0.05, dropout: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers = [torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x.flatten(1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def own_arguments(model: LightningModule) -> dict:
    return {name: model.hparams[name] for name in ("hidden", "lr", "dropout")}


def small(root: Path) -> list[str]:
    """One round of 10 clients, no progress bar, everything written under ``root``."""
    return [
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        "--data.init_args.num_clients=10",
        f"--trainer.default_root_dir={root}",
    ]


def test_a_user_model_starts_from_its_own_defaults(tmp_path):
    cli = run_cli(["fit", "--model", "tests.test_cli.TinyNet", *small(tmp_path)])
    assert type(cli.model) is TinyNet
    assert own_arguments(cli.model) == {"hidden": 7, "lr": 0.05, "dropout": 0.0}  # not hidden=[128], lr=0.2
    cli = run_cli(
        ["fit", "--model", "TinyNet", "--model.lr", "0.2", "--trainer.logger=false", *small(tmp_path)]
    )
    assert own_arguments(cli.model) == {"hidden": 7, "lr": 0.2, "dropout": 0.0}  # an explicit value is kept


def test_a_user_model_from_a_config_file_starts_from_its_own_defaults(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("model:\n  class_path: tests.test_cli.TinyNet\n  init_args: {hidden: 5}\n")
    cli = run_cli(["fit", "--config", str(config), "--trainer.logger=false", *small(tmp_path)])
    assert own_arguments(cli.model) == {"hidden": 5, "lr": 0.05, "dropout": 0.0}


def test_the_main_job_keeps_its_model_defaults(tmp_path):
    cli = run_cli(["fit", "--model.momentum", "0.5", "--trainer.logger=false", *small(tmp_path)])
    assert cli.model.hparams.lr == 0.2 and cli.model.hparams.momentum == 0.5
    assert list(cli.model.hparams.hidden) == [128]


def test_the_printed_log_location_names_the_logger_used(tmp_path, capsys):
    run_cli(["fit", "--trainer.logger=CSVLogger", f"--trainer.logger.save_dir={tmp_path}", *small(tmp_path)])
    out = capsys.readouterr().out
    assert "CSV logs: " in out and "metrics.csv" in out and "TensorBoard" not in out
    run_cli(["fit", "--trainer.logger=false", *small(tmp_path)])
    out = capsys.readouterr().out
    assert "No logger: nothing was logged." in out and "TensorBoard" not in out
    assert log_location(CSVLogger(tmp_path)).startswith("CSV logs: ")
    assert log_location(TensorBoardLogger(tmp_path)).startswith("TensorBoard logs: ")


def test_a_strategy_typo_on_the_command_line_fails_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", "--trainer.strategy.init_args.num_cluster", "5", *small(tmp_path)])
    assert stop.value.code != 0
    said = capsys.readouterr().err
    assert "FedRCStrategy has no argument 'num_cluster'; did you mean num_clusters?" in said


def test_the_strategys_choices_are_typed_and_checked_by_the_cli(tmp_path, capsys):
    """``executor``, ``optimizer_state``, ``optimizer_state_dtype`` and ``server_optimizer`` are
    ``Literal`` types: a value outside them stops the command line before training, naming the
    choices; a valid one reaches the strategy."""
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", "--trainer.strategy.init_args.executor=fast", *small(tmp_path)])
    assert stop.value.code != 0
    error = capsys.readouterr().err
    assert "executor" in error and "vectorized" in error
    cli = run_cli(["fit", "--trainer.strategy.init_args.server_optimizer=momentum", *small(tmp_path)])
    assert cli.trainer.strategy.plan.server_optimizer.kind == "momentum"


def test_print_config_lists_no_ddp_wrapper_arguments(capsys):
    with pytest.raises(SystemExit):
        run_cli(["fit", "--print_config"])
    out = capsys.readouterr().out
    assert "start_method: popen" in out
    for wrapper_only in ("ddp_comm_hook", "find_unused_parameters", "bucket_cap_mb", "static_graph"):
        assert wrapper_only not in out


def test_fast_dev_run_is_one_round_with_real_validation_and_test_numbers(tmp_path, capsys):
    cli = run_cli(
        [
            "fit",
            "--trainer.fast_dev_run=true",
            "--data.init_args.num_clients=10",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.current_epoch == 1
    # every unseen client is scored (a test pass cut after one item scored none of them: 0.0)
    assert 0.0 < float(metrics["test/global_acc"]) <= 1.0 and 0.0 < float(metrics["test/local_acc"]) <= 1.0
    assert "fast_dev_run: nothing was logged or checkpointed." in capsys.readouterr().out


def test_the_cli_without_a_logger_prints_real_numbers_and_no_logger_warning(tmp_path, capsys) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_cli(
            [
                "fit",
                "--trainer.logger=false",
                "--trainer.max_epochs=1",
                "--data.init_args.num_clients=10",
                "--trainer.enable_progress_bar=false",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )
    assert not [w for w in caught if "logger=True" in str(w.message)]
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("global accuracy"))
    assert 0.0 < float(row.split()[-1]) <= 1.0  # not nan: the test metrics reach the table


USER_CNN = """
import torch
from lightning.pytorch import LightningModule


class DigitCNN(LightningModule):
    def __init__(self, channels: int = 4, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.conv = torch.nn.Conv2d(1, channels, 3, padding=1)
        self.head = torch.nn.Linear(channels * 64, 10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
"""


def quick(root: Path) -> list[str]:
    """One round of 10 clients (5 per round), nothing written outside ``root``."""
    return ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
            "--trainer.strategy.init_args.clients_per_round=5",
            f"--trainer.default_root_dir={root}"]  # fmt: skip


def test_the_console_script_imports_the_model_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "mymodels.py").write_text(USER_CNN)
    script = Path(sys.executable).parent / "fedcluster"
    assert script.exists(), f"no console script at {script}: install the package (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # the package, not tmp_path
    args = [str(script), "fit", "--model", "mymodels.DigitCNN", "--model.channels", "3",
            "--data.init_args.as_images=true", "--data.init_args.num_clients=10", "--trainer.logger=false",
            *quick(tmp_path)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global accuracy" in done.stdout


def test_a_convolutional_model_on_flat_rows_stops_before_training_naming_as_images(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"serves flat inputs \(\d+, 64\).*as_images=true"):
        run_cli(["fit", "--model", "SmallCNN", "--data.init_args.num_clients=10", "--trainer.logger=false",
                 *quick(tmp_path)])  # fmt: skip
    with pytest.raises(ValueError, match="SmallCNN needs image inputs"):
        SmallCNN()(torch.zeros(2, 64))


def test_digits_as_images_are_the_same_scenario_reshaped() -> None:
    flat = DigitsFederated(num_clients=10, seed=3)
    images = DigitsFederated(num_clients=10, seed=3, as_images=True)
    assert images.train_x.shape[1:] == (1, 8, 8)
    assert torch.equal(images.train_x.reshape(-1, 64), flat.train_x)
    assert torch.equal(images.train_offsets, flat.train_offsets) and torch.equal(images.test_y, flat.test_y)
    assert torch.equal(images.metadata.concept, flat.metadata.concept)
    assert SmallCNN()(images.train_x[:3]).shape == (3, 10)


@pytest.fixture(scope="module")
def digit_bytes() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as uint8 pixels (0..16 scaled to 0..240) and their labels."""
    x, y = load_digits_tensors()
    return (x * 240).round().to(torch.uint8), y


def test_data_from_a_pt_file_is_the_from_tensors_scenario(tmp_path: Path, digit_bytes, capsys) -> None:
    pixels, y = digit_bytes
    x = pixels.float() / 255
    path = tmp_path / "digits.pt"
    torch.save({"x": x, "y": y}, path)
    cli = run_cli(["fit", "--data", str(path), "--data.num_clients", "12", "--data.concepts", "2",
                   "--data.corrupt_fraction", "0.25", "--data.image_shape=[1,8,8]", "--model", "SmallCNN",
                   "--trainer.logger=false", *quick(tmp_path)])  # fmt: skip
    dm = cli.datamodule
    assert type(dm) is TensorFileFederated and dm.num_clients == 12
    assert dm.hparams.dirichlet_alpha == 1.0 and dm.hparams.seed == 0  # its own defaults
    expected = FederatedDataModule.from_tensors(
        x.reshape(-1, 1, 8, 8), y, num_clients=12, concepts=2, corrupt_fraction=0.25, image_shape=(1, 8, 8)
    )
    assert dm.train_x.shape[1:] == (1, 8, 8)
    for name in ("train_x", "train_y", "train_offsets", "test_x", "val_y", "global_x", "global_y"):
        assert torch.equal(getattr(dm, name), getattr(expected, name)), name
    assert list(dm.metadata.feature_style) == list(expected.metadata.feature_style)  # corrupted clients
    assert "global accuracy" in capsys.readouterr().out


def test_an_npz_file_of_channels_last_uint8_images(tmp_path: Path, digit_bytes) -> None:
    pixels, y = digit_bytes
    path = tmp_path / "digits.npz"
    np.savez(path, x=pixels.reshape(-1, 8, 8, 1).numpy(), y=y.numpy())
    cli = run_cli(["fit", f"--data={path}", "--data.num_clients=10", "--data.image_shape=[1,8,8]",
                   "--data.channels_last=true", "--model=SmallCNN", "--trainer.logger=false",
                   *quick(tmp_path)])  # fmt: skip
    expected = FederatedDataModule.from_tensors(
        (pixels.float() / 255).reshape(-1, 1, 8, 8), y, num_clients=10, image_shape=(1, 8, 8)
    )  # uint8 is scaled to [0, 1]
    assert torch.equal(cli.datamodule.train_x, expected.train_x)


def test_the_help_documents_tensor_files_and_the_figures_switch(capsys) -> None:
    with pytest.raises(SystemExit):
        run_cli(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ".pt / .npz file of (x, y) tensors" in out and "--data.image_shape=[C,H,W]" in out
    assert "--figures {true,false}" in out


def test_figures_false_logs_scalars_and_no_images(tmp_path: Path) -> None:
    cli = run_cli(["fit", "--figures=false", "--data.init_args.num_clients=10",
                   "--trainer.check_val_every_n_epoch=1", *quick(tmp_path)])  # fmt: skip
    (monitor,) = [c for c in cli.trainer.callbacks if isinstance(c, ClusterMonitor)]
    (summary,) = [c for c in cli.trainer.callbacks if isinstance(c, DataSummary)]
    assert monitor.figures is False and summary.figures is False
    events = EventAccumulator(cli.trainer.logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert events.Tags()["images"] == []
    assert "train/loss" in events.Tags()["scalars"]


def test_an_unknown_strategy_name_is_refused_suggesting_the_registered_ones(tmp_path: Path, capsys) -> None:
    """Lightning's own error for ``strategy="fedrcc"`` lists its DDP-style choices. The CLI prints
    the library's message first (cli_errors)."""
    message = r"error: strategy='fedrcc' is not a registered strategy: did you mean 'fedrc'"
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", "--trainer.strategy", "fedrcc", "--trainer.max_epochs=1", "--trainer.logger=false",
                 f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert stop.value.code == 2
    said = capsys.readouterr().err
    assert re.match(message + r".*lightning-fedcluster's are fedrc, fedem, .*fedprox", said)


@pytest.mark.parametrize("given", ["IFCAStrategy", "lightning_fedcluster.IFCAStrategy"])
def test_a_strategy_class_name_alone_trains_that_class_with_its_defaults(given, tmp_path: Path) -> None:
    """``--trainer.strategy IFCAStrategy`` with no argument of it reaches the trainer as a string
    (jsonargparse builds a class only when an argument follows); it used to be refused with "did you
    mean 'IFCAStrategy'". It trains what the registered name ``ifca`` trains."""
    from lightning_fedcluster.strategies import registered_name

    assert registered_name(given) == "ifca"
    assert registered_name("fedrc") == "fedrc"
    assert registered_name("otherlib.IFCAStrategy") == "otherlib.IFCAStrategy"  # not ours: left alone
    cli = run_cli(["fit", "--trainer.strategy", given, "--trainer.max_epochs=1", "--trainer.logger=false",
                   "--trainer.enable_checkpointing=false",
                   f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert type(cli.trainer.strategy) is IFCAStrategy
    assert cli.trainer.strategy.num_clusters == IFCAStrategy().num_clusters


def test_the_results_table_says_why_the_concept_ari_of_one_concept_is_undefined(tmp_path, capsys) -> None:
    """``--data FILE`` builds one concept by default: the table says n/a and why, not 0.000."""
    from lightning_fedcluster.cli import results_table

    table = results_table(
        {"test/local_acc": 0.5, "test/global_acc": 0.4, "test/concept_ari": float("nan")}, []
    )
    assert "concept ARI            n/a   (undefined: the clients share one concept" in table
    assert "--data.concepts 3 builds the FedRC scenario" in table
    x, y = load_digits_tensors()
    torch.save({"x": x, "y": y}, tmp_path / "mine.pt")
    run_cli(["fit", f"--data={tmp_path / 'mine.pt'}", "--data.num_clients=12", "--data.corrupt_fraction=0",
             "--trainer.max_epochs=1", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
             f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert "concept ARI            n/a   (undefined" in capsys.readouterr().out


def test_the_default_fit_writes_a_checkpoint_at_every_round_end(tmp_path):
    """The main job validates every 25 rounds; Lightning's own ModelCheckpoint saves only after a
    validation, so a 2-round fit wrote none. The CLI's saves at every round end (verified files)."""
    cli = run_cli(["fit", "--trainer.logger=false", "--trainer.max_epochs=2", *small(tmp_path)[1:]])
    (saver,) = [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
    assert Path(saver.best_model_path).name.startswith("epoch=1-"), saver.best_model_path
    saved = torch.load(saver.best_model_path, weights_only=False)
    assert saved["epoch"] == 1 and saved["fedcluster_content_hash"].startswith("sha256:")
    none = run_cli(
        ["fit", "--trainer.enable_checkpointing=false", "--trainer.logger=false", *small(tmp_path)]
    )
    assert not any(isinstance(c, ModelCheckpoint) for c in none.trainer.callbacks)


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_each_subcommands_help_says_how_data_takes_a_file(subcommand, capsys):
    from lightning_fedcluster.cli import DATA_HELP

    with pytest.raises(SystemExit):
        run_cli([subcommand, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--data: {' '.join(DATA_HELP.split())}" in text


def built(*args: str) -> FedClusterCLI:
    """The CLI's classes built from ``args`` on the main job's defaults (real parsing), no fit."""
    return FedClusterCLI(
        LightningModule,
        FederatedDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=["--trainer.logger=false", *args],
        run=False,
    )


MAIN_JOB_CONFIG = FedRC.Config(
    group_round=20, group_assign="mean", group_margin=0.7, group_hold=10, group_late_round=25,
    omega_weighting_from=20,
)  # fmt: skip


def test_fedrcs_options_are_flags_under_config_and_keep_the_main_jobs_others():
    main = built().trainer.strategy
    assert main.algorithm.config == MAIN_JOB_CONFIG and main.discovery is None
    assert main.local_training.gradient_clip_val == 5.0  # the strategy's own keyword, beside config
    changed = built(
        "--trainer.strategy.config.group_round", "12", "--trainer.strategy.config.group_late_round=17"
    )
    assert changed.trainer.strategy.algorithm.config == FedRC.Config(
        **{**vars(MAIN_JOB_CONFIG), "group_round": 12, "group_late_round": 17}
    )
    paper = built("--trainer.strategy.config=null").trainer.strategy.algorithm
    assert paper.config == FedRC.Config() and paper.components == ()


def test_concept_discovery_is_one_flag_on_and_one_flag_off(tmp_path):
    on = built(
        "--trainer.strategy.discovery=ConceptDiscovery",
        "--trainer.strategy.discovery.gap=0.2",
        "--trainer.strategy.config=null",
    ).trainer.strategy
    assert on.discovery == ConceptDiscovery(gap=0.2)
    policy = [type(component) for component in ConceptDiscovery().components()]
    assert [type(component) for component in on.algorithm.components] == policy
    config = tmp_path / "discovery.yaml"
    config.write_text(
        "trainer:\n  strategy:\n    init_args:\n      config: null\n      discovery:\n"
        "        class_path: lightning_fedcluster.ConceptDiscovery\n        init_args: {min_share: 0.1}\n"
    )
    from_file = built("--config", str(config)).trainer.strategy
    assert from_file.discovery == ConceptDiscovery(min_share=0.1)
    assert [type(component) for component in from_file.algorithm.components] == policy
    off = built("--config", str(config), "--trainer.strategy.discovery=null").trainer.strategy
    assert off.discovery is None and off.algorithm.components == ()  # the paper's FedRC
    assert off.algorithm.config == FedRC.Config()


def test_fedrcs_option_given_as_a_strategy_flag_names_its_place_under_config(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", "--trainer.strategy.init_args.group_round", "12", *small(tmp_path)])
    assert stop.value.code != 0
    said = capsys.readouterr().err
    assert "FedRCStrategy has no argument 'group_round'; did you mean config.group_round?" in said
