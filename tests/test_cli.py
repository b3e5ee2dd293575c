"""The `fedcluster` command: defaults are the main job; `fit` ends with the results table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_fedcluster.callbacks import DataSummary, RoundProgressBar
from lightning_fedcluster.cli import MAIN_JOB_DEFAULTS, log_location, run_cli

ROOT = Path(__file__).parent.parent


def test_fit_prints_the_results_table_and_writes_tensorboard_logs(tmp_path, capsys):
    cli = run_cli(["fit", "--trainer.max_epochs=3", f"--trainer.default_root_dir={tmp_path}",
                   "--trainer.enable_progress_bar=false", "--data.init_args.num_clients=10"])
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
    cli = run_cli(["fit", "--trainer.logger=false", summary, "--trainer.callbacks.print_table=true",
                   "--trainer.max_epochs=1", "--data.init_args.num_clients=10",
                   f"--trainer.default_root_dir={tmp_path}"])
    summaries = [c for c in cli.trainer.callbacks if isinstance(c, DataSummary)]
    assert len(summaries) == 1 and summaries[0].print_table
    assert [type(c) for c in cli.trainer.callbacks if isinstance(c, ProgressBar)] == [RoundProgressBar]


def test_console_script_exits_zero_and_help_lists_the_strategy(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "lightning_fedcluster.cli", "fit", "--print_config"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lightning_fedcluster.FedRCStrategy" in done.stdout
    assert "DigitsFederated" in done.stdout
    assert MAIN_JOB_DEFAULTS["trainer.max_epochs"] == 150


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
    return ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
            "--data.init_args.num_clients=10", f"--trainer.default_root_dir={root}"]


def test_a_user_model_starts_from_its_own_defaults(tmp_path):
    cli = run_cli(["fit", "--model", "tests.integration.test_cli.TinyNet",
                   *small(tmp_path)])
    assert type(cli.model) is TinyNet
    assert own_arguments(cli.model) == {"hidden": 7, "lr": 0.05, "dropout": 0.0}  # not hidden=[128], lr=0.2
    cli = run_cli(["fit", "--model", "TinyNet", "--model.lr", "0.2", "--trainer.logger=false",
                   *small(tmp_path)])
    assert own_arguments(cli.model) == {"hidden": 7, "lr": 0.2, "dropout": 0.0}  # an explicit value is kept


def test_a_user_model_from_a_config_file_starts_from_its_own_defaults(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("model:\n  class_path: tests.integration.test_cli.TinyNet\n  init_args: {hidden: 5}\n")
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
    assert "Option 'num_cluster' is not accepted" in capsys.readouterr().err


def test_print_config_lists_no_ddp_wrapper_arguments(capsys):
    with pytest.raises(SystemExit):
        run_cli(["fit", "--print_config"])
    out = capsys.readouterr().out
    assert "start_method: popen" in out
    for wrapper_only in ("ddp_comm_hook", "find_unused_parameters", "bucket_cap_mb", "static_graph"):
        assert wrapper_only not in out


def test_fast_dev_run_is_one_round_with_real_validation_and_test_numbers(tmp_path, capsys):
    cli = run_cli(["fit", "--trainer.fast_dev_run=true", "--data.init_args.num_clients=10",
                   f"--trainer.default_root_dir={tmp_path}"])
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.current_epoch == 1
    # every unseen client is scored (a test pass cut after one item scored none of them: 0.0)
    assert 0.0 < float(metrics["test/global_acc"]) <= 1.0 and 0.0 < float(metrics["test/local_acc"]) <= 1.0
    assert "fast_dev_run: nothing was logged or checkpointed." in capsys.readouterr().out
