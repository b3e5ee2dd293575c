"""callbacks/image_logging.py: loggers without images get no figure drawn and raise nothing."""

from __future__ import annotations

from lightning.pytorch.loggers import CSVLogger

from lightning_fedcluster import FedRCStrategy, figures
from lightning_fedcluster.callbacks import DataSummary, image_logging
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def test_only_loggers_without_images_draw_nothing_and_raise_nothing(digits, tmp_path, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("a figure was drawn although no logger takes images")

    drawers = (
        "omega_figure",
        "shares_figure",
        "label_stats_figure",
        "accuracy_figure",
        "data_summary_figure",
    )
    for name in drawers:
        monkeypatch.setattr(figures, name, fail)
    monkeypatch.setattr(image_logging, "render", fail)
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=3, local_steps=1),
        max_epochs=2,
        logger=CSVLogger(str(tmp_path)),
        callbacks=[DataSummary()],
        check_val_every_n_epoch=1,
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    assert trainer.current_epoch == 2
