"""Figures cost nothing between validation rounds, can be switched off, and can be saved for a
paper (PDF / SVG at a chosen size, without the diagnostic titles)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_fedcluster import FedRCStrategy, figures
from lightning_fedcluster.callbacks import ClusterMonitor, DataSummary
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

DRAWERS = ("omega_figure", "shares_figure", "label_stats_figure", "accuracy_figure", "data_summary_figure")


@pytest.fixture(scope="module")
def digits() -> DigitsFederated:
    return DigitsFederated(num_clients=9, concepts=3, seed=0)


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


def test_figures_are_drawn_at_validation_rounds_only(digits, tmp_path, monkeypatch) -> None:
    calls = counted_fit(digits, tmp_path, monkeypatch, [DataSummary()])
    # 7 rounds, validation at rounds 3 and 6: each cluster figure twice (not at the last round,
    # 7), the data summary once
    assert calls == Counter(
        omega_figure=2, shares_figure=2, label_stats_figure=2, accuracy_figure=2, data_summary_figure=1
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
    assert calls["omega_figure"] == 4  # rounds 2, 3, 4, 6 (round 6 drawn once), not 7
    assert calls["accuracy_figure"] == 2


def pdf_size(path: Path) -> tuple[float, float]:
    box = re.search(rb"/MediaBox\s*\[\s*0\s+0\s+([\d.]+)\s+([\d.]+)\s*\]", path.read_bytes())
    assert box, "no MediaBox in the PDF"
    return float(box.group(1)), float(box.group(2))


def svg_size(path: Path) -> tuple[float, float]:
    head = path.read_text()
    width, height = (
        float(re.search(rf'<svg[^>]* {a}="([\d.]+)pt"', head).group(1)) for a in ("width", "height")
    )
    return width, height


def test_a_figure_is_saved_as_pdf_and_svg_at_the_chosen_size_without_titles(tmp_path) -> None:
    concept = torch.tensor([0, 0, 1, 1, 2, 2])
    omega = torch.softmax(torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), dim=1)
    paper = figures.omega_figure(omega, concept, round_index=7, size=(3.5, 1.8), titles=False)
    assert all(ax.get_title() == "" for ax in paper.axes)
    pdf = figures.save_figure(paper, tmp_path / "omega.pdf")
    svg = figures.save_figure(paper, tmp_path / "omega.svg")
    assert pdf_size(pdf) == pytest.approx((3.5 * 72, 1.8 * 72))  # points
    assert svg_size(svg) == pytest.approx((3.5 * 72, 1.8 * 72))
    text = svg.read_text()
    assert "cluster" in text and "concept 1" in text  # text stays text: the labels are there
    assert "weight on each cluster" not in text and "round 7" not in text  # the title is not
    # the TensorBoard version of the same figure keeps its title and size
    diagnostic = figures.omega_figure(omega, concept, round_index=7)
    assert "round 7" in diagnostic.axes[0].get_title()
    diagnostic_svg = figures.save_figure(diagnostic, tmp_path / "diagnostic.svg")
    assert "round 7" in diagnostic_svg.read_text()
    assert svg_size(diagnostic_svg) == pytest.approx((9 * 72, (2.3 + 0.4 * 3) * 72))
    with pytest.raises(ValueError, match="suffix"):
        figures.save_figure(paper, tmp_path / "omega.jpg")
    with pytest.raises(ValueError, match="size must be"):
        figures.omega_figure(omega, concept, size=(3.5, 0))


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
