"""callbacks/cluster_monitor.py: round metrics and figures in real TensorBoard files at validation
rounds and the end of training, every scalar (the test scores too) with the round as its step,
switched off or drawn for a paper, kept across a resume, and one monitor per trainer without
warnings."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_fedcluster import FedRCStrategy, figures
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.callbacks import ClusterMonitor, DataSummary
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.small_run import small_datamodule, small_strategy
from tests.helpers.tensorboard_text import event_texts

DRAWERS = ("omega_figure", "shares_figure", "label_stats_figure", "accuracy_figure", "data_summary_figure")


def counted_fit(digits, tmp_path: Path, monkeypatch, callbacks: list, rounds: int = 7) -> Counter:
    """Fit with TensorBoard (which takes images) and count each drawing function's calls."""
    calls: Counter = Counter()
    for name in DRAWERS:
        real = getattr(figures, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(figures, name, counted)
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=3, local_steps=1),
        max_epochs=rounds,
        logger=TensorBoardLogger(str(tmp_path)),
        callbacks=callbacks,
        check_val_every_n_epoch=3,
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    return calls


def test_figures_are_drawn_at_validation_rounds_and_the_end_only(digits, tmp_path, monkeypatch) -> None:
    calls = counted_fit(digits, tmp_path, monkeypatch, [DataSummary()])
    # 7 rounds, validation at rounds 3 and 6: each cluster figure at rounds 3 and 6 and at the end
    # of training (7), the accuracy per concept at the validation rounds, the data summary once
    assert calls == Counter(
        omega_figure=3, shares_figure=3, label_stats_figure=3, accuracy_figure=2, data_summary_figure=1
    )


def test_switched_off_figures_draw_nothing(digits, tmp_path, monkeypatch) -> None:
    monitor = ClusterMonitor(figures=False)
    calls = counted_fit(digits, tmp_path, monkeypatch, [monitor, DataSummary(figures=False)])
    assert sum(calls.values()) == 0
    assert sorted(monitor.history) == [3, 6]  # the validation metrics are still kept
    with pytest.raises(ValueError, match="figures must be True or False"):
        ClusterMonitor(figures="no")


def test_images_every_adds_rounds_to_the_validation_ones(digits, tmp_path, monkeypatch) -> None:
    calls = counted_fit(digits, tmp_path, monkeypatch, [ClusterMonitor(images_every=2)])
    assert calls["omega_figure"] == 5  # rounds 2, 3, 4, 6 (round 6 drawn once) and the end, 7
    assert calls["accuracy_figure"] == 2


def test_every_figure_of_a_run_is_drawn_for_a_paper(digits, tmp_path) -> None:
    monitor = ClusterMonitor()
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=3, local_steps=1),
        max_epochs=2,
        callbacks=[monitor],
        check_val_every_n_epoch=1,
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    drawn = monitor.draw(trainer, size=(3.0, 2.0), titles=False)
    assert set(drawn) == {
        "clusters/omega_clients_by_concept",
        "clusters/concept_shares",
        "clusters/label_stats_C",
        "val/per_concept",
    }
    for tag, fig in drawn.items():
        assert tuple(fig.get_size_inches()) == (3.0, 2.0), tag
        assert all(ax.get_title() == "" for ax in fig.axes), tag
        figures.save_figure(fig, tmp_path / (tag.replace("/", "_") + ".pdf"))
    summary = figures.data_summary_figure(
        digits.metadata.concept,
        torch.stack([digits.train_sizes, digits.val_sizes, digits.test_sizes], dim=1),
        {(0, "clean"): 3, (1, "clean"): 3, (2, "clean"): 3},
        title="Data",
        size=(7.0, 2.5),
        titles=False,
    )
    assert not summary._suptitle and all(ax.get_title() == "" for ax in summary.axes)
    assert len(list(tmp_path.glob("*.pdf"))) == 4


@pytest.fixture(scope="module")
def small_digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def test_tensorboard_gets_round_metrics_and_cluster_images(small_digits, tmp_path):
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="run")
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=6, local_steps=2),
        max_epochs=3,
        logger=logger,
        check_val_every_n_epoch=1,
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    for tag in ("train/loss", "train/acc", "val/local_acc", "val/global_acc", "val/concept_ari"):
        assert tag in scalars, scalars
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3], tag
    assert "clusters/concept0_share_in_cluster0" in scalars
    losses = [e.value for e in events.Scalars("train/loss")]
    assert losses[-1] < losses[0]
    images = events.Tags()["images"]
    for tag in ("clusters/omega_clients_by_concept", "clusters/label_stats_C", "clusters/concept_shares"):
        assert tag in images, images
    omega_image = events.Images("clusters/omega_clients_by_concept")[-1]
    assert omega_image.width >= 400 and omega_image.step == 3


def test_a_trainer_s_own_cluster_monitor_is_kept_without_an_override_warning():
    monitor = ClusterMonitor(images_every=5)
    trainer = make_trainer(small_strategy(), 1, callbacks=[monitor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=small_datamodule())
        trainer.test(trainer.lightning_module, datamodule=small_datamodule(), verbose=False)
    assert [c for c in trainer.callbacks if isinstance(c, ClusterMonitor)] == [monitor]
    assert not [w for w in caught if "override existing callbacks" in str(w.message)]


def test_fit_then_test_adds_one_cluster_monitor_and_warns_nothing():
    trainer = make_trainer(small_strategy(), 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(MLPClassifier(), datamodule=small_datamodule())
        trainer.test(trainer.lightning_module, datamodule=small_datamodule(), verbose=False)
    assert sum(isinstance(c, ClusterMonitor) for c in trainer.callbacks) == 1
    assert not [w for w in caught if "override existing callbacks" in str(w.message)]


CLUSTER_TAGS = ("clusters/omega_clients_by_concept", "clusters/concept_shares", "clusters/label_stats_C")


def test_a_short_fit_writes_readable_figures_at_validation_rounds_and_the_end(digits, tmp_path) -> None:
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
    # Cluster figures at the validation rounds (2, 4) and the last round (5), not at the other
    # rounds; the accuracy chart at the validation rounds; the data summary once at fit start.
    for tag in CLUSTER_TAGS:
        assert [image.step for image in events.Images(tag)] == [2, 4, 5], tag
    assert [image.step for image in events.Images("val/per_concept")] == [2, 4]
    assert [image.step for image in events.Images("data/summary")] == [0]
    assert [s.step for s in events.Scalars("train/loss")] == [1, 2, 3, 4, 5]  # scalars every round


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


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_every_scalar_and_figure_of_a_run_has_the_round_as_its_step(small_digits, tmp_path, executor):
    """The test scores (logged by Lightning's logger connector at the rounds the tested models
    trained) and the round metrics (ClusterMonitor) share one axis, the round, which is also
    Lightning's global_step (one step per round); a run that does not end on a validation round
    gets its cluster figures at its last round too."""
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="run")
    trainer = make_trainer(FedRCStrategy(3, clients_per_round=6, local_steps=2, executor=executor),
                           max_epochs=4, logger=logger, check_val_every_n_epoch=3)  # fmt: skip
    trainer.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    assert trainer.global_step == 4  # one step per round, on both executors
    results = trainer.test(trainer.lightning_module, datamodule=small_digits, verbose=False)[0]
    assert results["step"] == 4.0  # the rounds the tested models trained
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    steps = {tag: sorted({e.step for e in events.Scalars(tag)}) for tag in events.Tags()["scalars"]}
    assert steps["train/loss"] == [1, 2, 3, 4] and steps["val/local_acc"] == [3]
    assert steps["test/local_acc"] == steps["test/concept_ari"] == [4]
    assert "epoch" not in steps and "step" not in steps, sorted(steps)
    off_axis = {tag: s for tag, s in steps.items() if not set(s) <= {0, 1, 2, 3, 4}}
    assert not off_axis, off_axis
    images = {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()["images"]}
    assert images["clusters/omega_clients_by_concept"] == [3, 4]
    assert images["clusters/concept_shares"] == [3, 4] and images["val/per_concept"] == [3]


def test_tensorboard_gets_each_round_s_server_actions_as_text_at_its_step(small_digits, tmp_path):
    """The grouping after round 1 (``group_round=1``) is written at step 1, and the merges at the
    end of rounds 2 and 3 (``merge_after=1``, a threshold that always merges) at steps 2 and 3,
    each text naming its step's round; ``clusters/active`` counts down with them."""
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="run")
    strategy = FedRCStrategy(
        4,
        clients_per_round=6,
        local_steps=2,
        config=FedRC.Config(group_round=1, merge_threshold=100.0, merge_after=1),
    )
    trainer = make_trainer(strategy, max_epochs=3, logger=logger, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    logger.experiment.flush()
    texts = event_texts(logger.log_dir)
    assert sorted(texts) == [1, 2, 3]
    assert texts[1].startswith("round 1: grouped")
    assert texts[2].startswith("round 2: merged cluster") and texts[3].startswith("round 3: merged cluster")
    assert trainer.lightning_module.round_events == [texts[3]]
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("clusters/active")] == [4.0, 3.0, 2.0]


def test_rounds_without_server_actions_write_no_event_text(small_digits, tmp_path):
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="run")
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=6, local_steps=2), max_epochs=2, logger=logger, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=small_digits)
    logger.experiment.flush()
    assert event_texts(logger.log_dir) == {} and trainer.lightning_module.round_events == []
