"""Every example config runs for 2 rounds through the CLI on reduced sizes (vision ones on small
files in torchvision's format; skipped without torchvision)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml

from lightning_fedcluster.cli import run_cli
from tests.conftest import NEEDS_VISION

EXAMPLES = Path(__file__).parent.parent / "examples"


def write_electricity_like(path: Path, n: int = 1500, seed: int = 0) -> Path:
    """A table with the Electricity columns; the price rule flips halfway through time."""
    rng = np.random.default_rng(seed)
    date = np.sort(rng.uniform(0, 1, n))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "day", "period", "nswprice", "nswdemand", "vicprice", "vicdemand",
                         "transfer", "class"])
        for i in range(n):
            values = rng.uniform(0, 1, 7)
            up = (values[2] > 0.5) ^ (date[i] > 0.5)
            writer.writerow([f"{date[i]:.6f}", *(f"{v:.5f}" for v in values), "UP" if up else "DOWN"])
    return path


def run(config: str, tmp_path: Path, *overrides: str):
    args = ["fit", "--config", str(EXAMPLES / config), "--trainer.max_epochs=2",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
            "--trainer.check_val_every_n_epoch=1", *overrides]
    cli = run_cli(args)
    assert cli.trainer.current_epoch == 2
    return cli


def test_every_example_has_its_header_and_a_test() -> None:
    configs = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert configs == ["electricity.yaml", "fedem_synthetic.yaml", "fedrc_cifar10.yaml",
                       "fedrc_digits_cnn.yaml", "fedrc_fashion_mnist.yaml", "fedsoft_synthetic.yaml"]
    for name in configs:
        text = (EXAMPLES / name).read_text()
        assert f"fedcluster fit --config examples/{name}" in text
        assert "Paper" in text or "paper" in text
        config = yaml.safe_load(text)
        assert {"trainer", "model", "data"} <= set(config)
        assert "class_path" in config["trainer"]["strategy"]


def test_fedem_synthetic(tmp_path: Path, capsys) -> None:
    # No global clients here: their iterated E-step dominates a 2-round run.
    cli = run("fedem_synthetic.yaml", tmp_path, "--data.init_args.num_clients=12",
              "--data.init_args.global_test_size=0")
    assert type(cli.trainer.strategy).__name__ == "FedEMStrategy"
    assert cli.datamodule.num_clients == 12
    assert "global accuracy" in capsys.readouterr().out


def test_fedrc_digits_cnn(tmp_path: Path) -> None:
    cli = run("fedrc_digits_cnn.yaml", tmp_path, "--data.init_args.num_clients=10",
              "--trainer.strategy.init_args.clients_per_round=5")
    assert type(cli.model).__name__ == "SmallCNN"
    assert cli.datamodule.train_x.shape[1:] == (1, 8, 8)
    assert 0.0 < float(cli.trainer.callback_metrics["test/global_acc"]) <= 1.0


def test_fedsoft_synthetic(tmp_path: Path) -> None:
    cli = run("fedsoft_synthetic.yaml", tmp_path, "--data.init_args.num_clients=10",
              "--data.init_args.global_test_size=40", "--trainer.strategy.init_args.selection_size=3",
              "--trainer.strategy.init_args.local_epochs=1")
    assert type(cli.trainer.strategy).__name__ == "FedSoftStrategy"
    assert cli.datamodule.task == "regression"


def test_electricity(tmp_path: Path) -> None:
    path = write_electricity_like(tmp_path / "electricity.csv")
    cli = run("electricity.yaml", tmp_path, f"--data.init_args.path={path}",
              "--data.init_args.drift_rows=[900]", "--data.init_args.num_clients=10",
              "--trainer.strategy.init_args.clients_per_round=5")
    dm = cli.datamodule
    assert dm.num_clients == 10 and dm.feature_columns[0] == "period"  # date and day are not features
    assert [dm.global_split(g)[1].bincount().tolist() for g in range(2)] == [[90, 90], [60, 60]]


def test_fedrc_fashion_mnist(tmp_path: Path) -> None:
    pytest.importorskip("torchvision", reason=NEEDS_VISION)
    from tests.helpers.vision_files import write_fashion_mnist

    root = write_fashion_mnist(tmp_path / "data", n_train=120, n_test=20)
    cli = run("fedrc_fashion_mnist.yaml", tmp_path, f"--data.init_args.root={root}",
              "--data.init_args.download=false", "--data.init_args.num_clients=4",
              "--trainer.strategy.init_args.clients_per_round=2", "--trainer.limit_val_batches=0")
    assert cli.datamodule.num_clients == 4 and cli.datamodule.num_global_clients == 3


def test_fedrc_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchvision", reason=NEEDS_VISION)
    from tests.helpers.vision_files import accept_small_cifar, write_cifar10

    accept_small_cifar(monkeypatch)
    root = write_cifar10(tmp_path / "data", per_batch=20, n_test=20)
    cli = run("fedrc_cifar10.yaml", tmp_path, f"--data.init_args.root={root}",
              "--data.init_args.download=false", "--data.init_args.num_clients=4",
              "--data.init_args.copies=1", "--model.init_args.weights=null",
              "--model.init_args.width_mult=0.25", "--trainer.strategy.init_args.clients_per_round=2",
              "--trainer.strategy.init_args.drop_last=false", "--trainer.limit_val_batches=0")
    assert cli.datamodule.train_x.shape[1:] == (3, 32, 32)


def test_a_fedrc_config_switches_to_fedavg(tmp_path: Path) -> None:
    # The README's switch: the FedRC config's num_clusters stays in init_args; FedAvg says it is unused.
    csv = write_electricity_like(tmp_path / "elec.csv")
    with pytest.warns(UserWarning, match="FedAvgStrategy trains one model: num_clusters=3"):
        cli = run("electricity.yaml", tmp_path, f"--data.init_args.path={csv}",
                  "--data.init_args.num_clients=10", "--data.init_args.drift_rows=[750]",
                  "--trainer.strategy.init_args.clients_per_round=5",
                  "--trainer.strategy.class_path=lightning_fedcluster.FedAvgStrategy")
    assert type(cli.trainer.strategy).__name__ == "FedAvgStrategy"
    assert cli.trainer.lightning_module.num_clusters == 1
