"""figures.py: fixed colour scales, clients sorted by concept, numbers in the cells, and a figure
saved for a paper (PDF / SVG at a chosen size, without the diagnostic titles)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_fedcluster import figures


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
