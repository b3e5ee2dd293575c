"""TensorBoard figures: readable size in real event files, fixed colour scales, clients sorted by
concept, numbers in the cells, and nothing drawn (and no error) for loggers without images."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_fedcluster import FedRCStrategy, figures
from lightning_fedcluster.callbacks import ClusterMonitor, DataSummary, image_logging
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

CLUSTER_TAGS = ("clusters/omega_clients_by_concept", "clusters/concept_shares", "clusters/label_stats_C")


@pytest.fixture(scope="module")
def digits() -> DigitsFederated:
    return DigitsFederated(num_clients=9, concepts=3, seed=0)


def test_a_short_fit_writes_readable_figures_at_validation_rounds_only(digits, tmp_path) -> None:
    logger = TensorBoardLogger(str(tmp_path), name="run")
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=3, local_steps=1),
        max_epochs=5,
        logger=[logger, CSVLogger(str(tmp_path))],
        callbacks=[DataSummary()],
        check_val_every_n_epoch=2,
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()["images"]
    assert set(tags) == {*CLUSTER_TAGS, "val/per_concept", "data/summary"}
    for tag in tags:
        for image in events.Images(tag):
            assert image.width >= 400 and image.height >= 200, (tag, image.width, image.height)
    # Cluster figures and the accuracy chart at the validation rounds (2, 4) only, not at the
    # other rounds nor the last one (5); the data summary once at fit start.
    for tag in (*CLUSTER_TAGS, "val/per_concept"):
        assert [image.step for image in events.Images(tag)] == [2, 4], tag
    assert [image.step for image in events.Images("data/summary")] == [0]
    assert [s.step for s in events.Scalars("train/loss")] == [1, 2, 3, 4, 5]  # scalars every round


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


def test_omega_figure_sorts_clients_by_concept_on_a_fixed_scale() -> None:
    concept = torch.tensor([2, 0, 1, 0, 2, 1])
    omega = torch.tensor([[0.1, 0.2], [0.2, 0.3], [0.3, 0.2], [0.4, 0.1], [0.45, 0.05], [0.0, 0.5]])
    fig = figures.omega_figure(omega, concept, round_index=7, seen=torch.tensor([1, 1, 1, 0, 0, 0]).bool())
    ax = fig.axes[0]
    image = ax.images[0]
    assert (image.norm.vmin, image.norm.vmax) == (0.0, 1.0)  # not scaled to the maximum (0.5)
    order = [1, 3, 2, 5, 0, 4]  # concept 0, 0, 1, 1, 2, 2; original order kept within a concept
    np.testing.assert_allclose(np.asarray(image.get_array()), omega[order].T.numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in order]
    boundaries = sorted(line.get_xdata()[0] for line in ax.get_lines())
    assert boundaries == [1.5, 3.5]
    top = ax.child_axes[0]
    assert [t.get_text() for t in top.get_xticklabels()] == ["concept 0", "concept 1", "concept 2"]
    assert "round 7" in ax.get_title() and "3/6 clients seen" in ax.get_title()
    assert ax.get_xlabel().startswith("client id") and ax.get_ylabel() == "cluster"
    assert fig.axes[1].get_ylabel().startswith("ω")  # the colour bar is labelled
    assert figures.render(fig).shape[1] >= 400


def test_shares_and_label_statistics_write_their_numbers_and_labels() -> None:
    shares = torch.tensor([[0.8, 0.2], [0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)
    ax = figures.shares_figure(shares, round_index=3).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{v:.2f}" for v in shares.flatten().tolist())
    assert (ax.images[0].norm.vmin, ax.images[0].norm.vmax) == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["concept 0", "concept 1", "concept 2"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cluster 0", "cluster 1"]

    stats = torch.softmax(torch.randn(10, 3, generator=torch.Generator().manual_seed(0)), dim=0)
    ax = figures.label_stats_figure(stats, round_index=3).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(y) for y in range(10)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cluster 0", "cluster 1", "cluster 2"]
    assert len(ax.texts) == 30 and ax.get_xlabel() == "class y"
    assert ax.images[0].norm.vmax == pytest.approx(0.3)  # 3 / C, fixed whatever the values
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), stats.T.double().numpy())


def test_accuracy_figure_draws_one_line_per_concept_over_rounds() -> None:
    history = {
        r: {
            "val/global_acc_concept0": 0.1 * r,
            "val/global_acc_concept1": 0.05 * r,
            "val/global_acc": 0.075 * r,
        }
        for r in (2, 4, 6)
    }
    per_concept = {0: "val/global_acc_concept0", 1: "val/global_acc_concept1"}
    ax = figures.accuracy_figure(history, per_concept, "val/global_acc").axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"concept 0", "concept 1", "mean of the global clients"}
    assert list(lines["concept 1"].get_xdata()) == [2, 4, 6]
    np.testing.assert_allclose(lines["concept 0"].get_ydata(), [0.2, 0.4, 0.6])
    assert ax.get_ylim() == (0.0, 1.0) and ax.get_xlabel() == "round" and ax.get_ylabel() == "accuracy"
    mse = {r: {"val/global_mse_concept0": 3.0 / r} for r in (1, 2)}
    ax = figures.accuracy_figure(mse, {0: "val/global_mse_concept0"}).axes[0]
    assert ax.get_ylabel() == "MSE"


def test_a_resumed_fit_keeps_the_accuracy_history(digits, tmp_path) -> None:
    def trainer(rounds: int, **options):
        strategy = FedRCStrategy(3, clients_per_round=3, local_steps=1)
        return make_trainer(strategy, max_epochs=rounds, check_val_every_n_epoch=1, **options)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer(2, enable_checkpointing=True, callbacks=[checkpoint]).fit(
        MLPClassifier(lr=0.2), datamodule=digits
    )
    resumed = trainer(4)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=digits, ckpt_path=str(tmp_path / "last.ckpt"))
    (monitor,) = [c for c in resumed.callbacks if isinstance(c, ClusterMonitor)]
    assert sorted(monitor.history) == [1, 2, 3, 4]
    assert "val/global_acc_concept0" in monitor.history[1]


def test_images_every_is_checked() -> None:
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="images_every"):
            ClusterMonitor(images_every=bad)
