"""A run with ``logger=False`` is quiet: nothing calls ``self.log(..., logger=True)`` without a logger."""

from __future__ import annotations

import warnings

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.cli import run_cli
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_logger_false_gives_no_no_logger_warnings() -> None:
    dm = DigitsFederated(num_clients=6, concepts=3, seed=0)
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=3, local_steps=1),
        max_epochs=2,
        logger=False,
        check_val_every_n_epoch=1,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
        trainer.validate(trainer.lightning_module, datamodule=dm, verbose=False)
        (results,) = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "logger=True" in m or "no logger configured" in m], messages
    assert 0.0 < results["test/global_acc"] <= 1.0  # the test metrics are still returned
    assert "test/local_acc" in trainer.callback_metrics


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
