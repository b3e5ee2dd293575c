"""Diagnostic figures of a clustered federated run, as matplotlib Figures; `save_figure` writes one
for a paper (PDF / SVG / PNG) and `render` gives a pixel array (what TensorBoard receives).

The figures:

- `omega_figure`: ω, each client's weight on each cluster (clients sorted by true concept);
- `shares_figure`: how each true concept's data is split over the clusters;
- `label_stats_figure`: FedRC's label statistics C_{y,k};
- `accuracy_figure`: validation accuracy (or MSE) of each concept's global client over rounds;
- `data_summary_figure`: the data scenario (label mix, split sizes, client types).

`ClusterMonitor` logs the first four to TensorBoard at validation rounds and `DataSummary` the last
at fit start; ``ClusterMonitor.draw`` gives a run's current figures. By default a figure has the
fixed size and diagnostic title used in TensorBoard. For a paper pass ``size=(width, height)`` in
inches (the layout then adapts to that size) and ``titles=False`` (the caption says what it
shows), then `save_figure`::

    import matplotlib
    from lightning_fedcluster import figures

    # after trainer.fit(model, datamodule=dm)
    omega, concept = trainer.lightning_module.client_state.omega, dm.metadata.concept
    with matplotlib.rc_context({"font.size": 7}):
        fig = figures.omega_figure(omega, concept, size=(3.3, 1.6), titles=False)
    figures.save_figure(fig, "omega.pdf")

Figures are built as ``matplotlib.figure.Figure`` objects with the Agg canvas, never through
pyplot, so nothing is registered globally: a figure is freed as soon as it is no longer
referenced, and no display backend is touched. Weights and shares use a fixed 0–1 colour scale so
rounds can be compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

__all__ = [
    "DPI",
    "accuracy_figure",
    "concept_order",
    "data_summary_figure",
    "label_stats_figure",
    "mark_concepts",
    "omega_figure",
    "render",
    "save_figure",
    "shares_figure",
]

DPI = 100
"""Pixels per inch of every figure: a 6.4-inch-wide figure is 640 px wide."""
CMAP = "viridis"
MAX_ANNOTATED_CELLS = 240
"""Above this many cells a heatmap's numbers would overlap, so they are left out."""
FORMATS = (".pdf", ".svg", ".png")
"""The file types `save_figure` writes."""
Size = tuple[float, float]


def render(figure: Figure) -> np.ndarray:
    """The figure drawn with the Agg canvas, as a uint8 array [height, width, 3]."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_figure(figure: Figure, path: str | Path, *, dpi: int = 300) -> Path:
    """Write ``figure`` to ``path`` (.pdf, .svg or .png, from the suffix) at the figure's own size,
    uncropped, so that it is exactly the ``size`` it was drawn at. Text stays text (TrueType in PDF,
    ``<text>`` in SVG), as journals' checks and vector editors expect. ``dpi``: PNG only."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(
            f"path={str(path)!r}: save_figure writes {', '.join(FORMATS)} files; change the suffix"
        )
    FigureCanvasAgg(figure)  # a canvas for figures that never had one
    with matplotlib.rc_context({"pdf.fonttype": 42, "svg.fonttype": "none"}):
        figure.savefig(path, format=path.suffix.lower()[1:], dpi=dpi)
    return path


def concept_order(concept: Tensor | None, count: int) -> Tensor:
    """Client indices sorted by true concept (stable, so clients keep their order within a concept);
    the identity without concepts."""
    if concept is None:
        return torch.arange(count)
    return torch.argsort(concept.cpu(), stable=True)


def mark_concepts(ax: Axes, sorted_concepts: Sequence[int], line_colour: str = "red") -> None:
    """Vertical lines between the concept blocks of clients sorted by concept (x positions
    0..n-1), and each block's concept named above the axes ("c3" beyond six concepts, where
    "concept 3" would overlap). Nothing for a single concept."""
    if len(set(sorted_concepts)) < 2:
        return
    starts = [0] + [p for p in range(1, len(sorted_concepts)) if sorted_concepts[p] != sorted_concepts[p - 1]]
    ends = starts[1:] + [len(sorted_concepts)]
    for start in starts[1:]:
        ax.axvline(start - 0.5, color=line_colour, linewidth=2)
    many = len(starts) > 6
    top = ax.secondary_xaxis("top")
    top.set_xticks(
        [(a + b - 1) / 2 for a, b in zip(starts, ends, strict=True)],
        labels=[f"{'c' if many else 'concept '}{sorted_concepts[a]}" for a in starts],
    )
    top.tick_params(length=0, labelsize="small" if many else "medium")  # scales with font.size


def _annotate(ax: Axes, values: np.ndarray, fmt: str, threshold: float) -> None:
    """Write each cell's value; white on dark cells (below `threshold` on viridis), black elsewhere."""
    rows, cols = values.shape
    if rows * cols > MAX_ANNOTATED_CELLS:
        return
    size = "small" if rows * cols <= 60 else "x-small"  # relative: scales with font.size
    for r in range(rows):
        for c in range(cols):
            colour = "white" if values[r, c] < threshold else "black"
            ax.text(c, r, format(values[r, c], fmt), ha="center", va="center", fontsize=size, color=colour)


def _frame(
    width: float,
    height: float,
    left: float,
    bottom: float,
    top: float,
    colour_bar: bool = True,
    size: Size | None = None,
) -> tuple[Figure, Axes, Axes | None]:
    """A figure of `width` × `height` inches with one axes placed by fixed margins in inches and,
    when asked, a colour-bar axes at the right. Fixed margins instead of a layout engine: the
    labels are known in advance, and constrained layout doubles the drawing time. With `size`
    (a figure for a paper) the figure is that size and constrained layout places the axes; the
    colour bar's axes is then None (`fig.colorbar(..., ax=ax)` makes it)."""
    if size is not None:
        fig = Figure(figsize=_size_arg(size), dpi=DPI, layout="constrained")
        return fig, fig.add_subplot(), None
    fig = Figure(figsize=(width, height), dpi=DPI)
    right = 1.25 if colour_bar else 0.3
    inner = 1 - (bottom + top) / height
    ax = fig.add_axes((left / width, bottom / height, 1 - (left + right) / width, inner))
    cax = None
    if colour_bar:
        cax = fig.add_axes(((width - right + 0.15) / width, bottom / height, 0.15 / width, inner))
    return fig, ax, cax


def _size_arg(size: Size) -> Size:
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        raise ValueError(f"size must be (width, height) in inches, both > 0, got {size!r}")
    return float(size[0]), float(size[1])


def _title(ax: Axes, text: str, titles: bool, **options: object) -> None:
    """The diagnostic title, unless `titles` is off (figures for papers carry a caption instead)."""
    if titles:
        ax.set_title(text, **options)


def _round_title(text: str, round_index: int | None) -> str:
    return text if round_index is None else f"{text} — round {round_index}"


def omega_figure(
    omega: Tensor,
    concept: Tensor | None = None,
    round_index: int | None = None,
    seen: Tensor | None = None,
    *,
    size: Size | None = None,
    titles: bool = True,
) -> Figure:
    """Heatmap of ω [M clients, K clusters] with clusters as rows and clients as columns, clients
    sorted by true `concept` (boundaries marked), on a fixed 0–1 colour scale with a colour bar.
    `seen` [M] (bool) adds how many clients have taken part so far to the title. `size` (inches)
    and `titles`: see the module docstring."""
    omega = omega.detach().cpu().double()
    num_clients, num_clusters = omega.shape
    order = concept_order(concept, num_clients)
    fig, ax, cax = _frame(9, min(10.0, 2.3 + 0.4 * num_clusters), left=0.8, bottom=0.7, top=0.7, size=size)
    image = ax.imshow(
        omega[order].T.numpy(), aspect="auto", cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest"
    )
    fig.colorbar(image, cax=cax, ax=ax, label="ω (weight on the cluster)")
    ax.set_yticks(range(num_clusters), labels=[str(k) for k in range(num_clusters)])
    ax.set_ylabel("cluster")
    sorted_by = "sorted by true concept" if concept is not None else "in index order"
    if num_clients <= 60:
        ax.set_xticks(range(num_clients), labels=[str(int(i)) for i in order], fontsize=7, rotation=90)
        ax.set_xlabel(f"client id ({sorted_by})")
    else:
        ax.set_xlabel(f"client position, {num_clients} clients ({sorted_by})")
    if concept is not None:
        mark_concepts(ax, concept.cpu()[order].tolist())
    title = "ω: each client's weight on each cluster"
    if seen is not None:
        title += f" ({int(seen.sum())}/{num_clients} clients seen)"
    _title(ax, _round_title(title, round_index), titles)
    return fig


def shares_figure(
    shares: Tensor, round_index: int | None = None, *, size: Size | None = None, titles: bool = True
) -> Figure:
    """Heatmap of the concept × cluster shares [P, K] (each concept's data split over the clusters,
    rows summing to 1) with the numbers written in the cells, on a fixed 0–1 colour scale."""
    values = shares.detach().cpu().double().numpy()
    num_concepts, num_clusters = values.shape
    fig, ax, cax = _frame(
        min(14.0, max(6.4, 2.3 + 0.9 * num_clusters)),
        min(10.0, 1.2 + 0.5 * num_concepts),
        1.0,
        0.45,
        0.4,
        size=size,
    )
    image = ax.imshow(values, aspect="auto", cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, cax=cax, ax=ax, label="share of the concept's data")
    ax.set_xticks(range(num_clusters), labels=[f"cluster {k}" for k in range(num_clusters)])
    ax.set_yticks(range(num_concepts), labels=[f"concept {c}" for c in range(num_concepts)])
    _annotate(ax, values, ".2f", 0.5)
    _title(ax, _round_title("Share of each true concept's data per cluster", round_index), titles)
    return fig


def label_stats_figure(
    stats: Tensor, round_index: int | None = None, *, size: Size | None = None, titles: bool = True
) -> Figure:
    """Heatmap of FedRC's label statistics C_{y,k} [C classes, K clusters] (label y's share of
    cluster k's data; each cluster's column sums to 1), clusters as rows and classes as columns,
    with the numbers in the cells. The colour scale is fixed at 0 to min(1, 3/C): three times the
    uniform share saturates, so label skew stays visible with many classes."""
    values = stats.detach().cpu().double().numpy().T
    num_clusters, num_classes = values.shape
    top = min(1.0, 3.0 / num_classes)
    fig, ax, cax = _frame(
        min(14.0, max(6.4, 2.3 + 0.55 * num_classes)),
        min(10.0, 1.4 + 0.45 * num_clusters),
        1.0,
        0.6,
        0.4,
        size=size,
    )
    image = ax.imshow(values, aspect="auto", cmap=CMAP, vmin=0.0, vmax=top, interpolation="nearest")
    fig.colorbar(image, cax=cax, ax=ax, label="$C_{y,k}$", extend="max" if top < 1 else "neither")
    if num_classes <= 40:
        ax.set_xticks(range(num_classes), labels=[str(y) for y in range(num_classes)])
    ax.set_yticks(range(num_clusters), labels=[f"cluster {k}" for k in range(num_clusters)])
    ax.set_xlabel("class y")
    _annotate(ax, values, ".2f", top / 2)
    _title(ax, _round_title("$C_{y,k}$: share of cluster k's data with label y", round_index), titles)
    return fig


def accuracy_figure(
    history: Mapping[int, Mapping[str, float]],
    per_concept: Mapping[int, str],
    mean: str | None = None,
    *,
    size: Size | None = None,
    titles: bool = True,
) -> Figure:
    """Line chart over rounds: one line per concept (`per_concept` maps a concept to its metric
    name) and, when given, the `mean` metric dashed. `history` maps a round to its logged metrics.
    Accuracies are drawn on a fixed 0–1 axis; other metrics (MSE) on an automatic one."""
    rounds = sorted(history)
    fig, ax, _ = _frame(7, 4, left=0.8, bottom=0.6, top=0.4, colour_bar=False, size=size)
    names = {f"concept {c}": name for c, name in sorted(per_concept.items())}
    if mean is not None:
        names["mean of the global clients"] = mean
    for label, name in names.items():
        points = [(r, history[r][name]) for r in rounds if name in history[r]]
        style = {"color": "black", "linestyle": "--"} if name == mean else {}
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker="o", markersize=3, label=label, **style)
    is_accuracy = all("acc" in name for name in names.values())
    if is_accuracy:
        ax.set_ylim(0, 1)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy" if is_accuracy else "MSE")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    metric = "accuracy" if is_accuracy else "MSE"
    _title(ax, f"Validation {metric} on each concept's global client", titles)
    return fig


def data_summary_figure(
    concept: Tensor,
    split_sizes: Tensor,
    type_counts: Mapping[tuple[int, str], int],
    label_shares: Tensor | None = None,
    targets: Tensor | None = None,
    title: str | None = None,
    *,
    size: Size | None = None,
    titles: bool = True,
) -> Figure:
    """Three panels over the clients sorted by true concept (boundaries marked): each client's
    label mix as stacked bars (`label_shares` [M, C]) or, for regression, its target mean ± std
    (`targets` [M, 2]); its train / validation / test sizes (`split_sizes` [M, 3]); and the number
    of clients per concept and input style (`type_counts`, the style being "clean" or a corruption)."""
    num_clients = concept.numel()
    order = concept_order(concept, num_clients)
    sorted_concepts = concept.cpu()[order].tolist()
    width, height = 14.0, 5.0
    if size is None:
        fig = Figure(figsize=(width, height), dpi=DPI)
        grid = {
            "left": 0.7 / width,
            "right": 1 - 0.3 / width,
            "bottom": 1.2 / height,
            "top": 1 - 0.95 / height,
        }
        grid["wspace"] = 0.35
    else:
        fig, grid = Figure(figsize=_size_arg(size), dpi=DPI, layout="constrained"), {}
    left, middle, right = fig.subplots(1, 3, width_ratios=[3, 2, 1.6], gridspec_kw=grid)
    positions = np.arange(num_clients)
    if label_shares is not None:
        shares = label_shares.cpu().double()[order].numpy()
        colours = _colours(shares.shape[1])
        bottom = np.zeros(num_clients)
        for c in range(shares.shape[1]):
            left.bar(positions, shares[:, c], bottom=bottom, width=1.0, color=colours[c], label=str(c))
            bottom += shares[:, c]
        left.set_ylim(0, 1)
        left.set_ylabel("share of the client's samples")
        _title(left, "Label mix of each client", titles, pad=22)
        if shares.shape[1] <= 20:
            left.legend(title="label", fontsize=7, title_fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    elif targets is not None:
        values = targets.cpu().double()[order].numpy()
        left.errorbar(positions, values[:, 0], yerr=values[:, 1], fmt="o", markersize=3)
        left.set_ylabel("target mean ± std")
        _title(left, "Targets of each client", titles, pad=22)
    sizes = split_sizes.cpu().double()[order].numpy()
    bottom = np.zeros(num_clients)
    splits = (("train", "#4c72b0"), ("validation", "#dd8452"), ("test", "#55a868"))
    for s, (name, colour) in enumerate(splits):
        middle.bar(positions, sizes[:, s], bottom=bottom, width=1.0, color=colour, label=name)
        bottom += sizes[:, s]
    middle.set_ylim(0, 1.3 * max(1.0, float(bottom.max())))  # room for the legend above the bars
    middle.set_ylabel("samples")
    _title(middle, "Samples per client", titles, pad=22)
    middle.legend(fontsize=7, loc="upper center", ncols=3)
    for ax in (left, middle):
        ax.set_xlim(-0.5, num_clients - 0.5)
        if num_clients <= 40:
            ax.set_xticks(positions, labels=[str(int(i)) for i in order], fontsize=6, rotation=90)
            ax.set_xlabel("client id (sorted by true concept)")
        else:
            ax.set_xlabel(f"client position ({num_clients} clients, sorted by true concept)")
        mark_concepts(ax, sorted_concepts, line_colour="black")
    _type_panel(right, type_counts, titles)
    if title and titles:
        fig.suptitle(title, fontsize=12)
    return fig


def _type_panel(ax: Axes, type_counts: Mapping[tuple[int, str], int], titles: bool) -> None:
    concepts = sorted({c for c, _ in type_counts})
    kinds = sorted({k for _, k in type_counts}, key=lambda k: (k != "clean", k))
    grid = np.array([[type_counts.get((c, k), 0) for k in kinds] for c in concepts], dtype=float)
    ax.imshow(grid, cmap="Blues", aspect="auto", vmin=0, vmax=max(1.0, grid.max()))
    ax.set_xticks(range(len(kinds)), labels=kinds, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(concepts)), labels=[f"concept {c}" for c in concepts], fontsize=8)
    ax.set_xlabel("input style")
    _title(ax, "Clients per concept\nand input style", titles, pad=10)
    if grid.size <= MAX_ANNOTATED_CELLS:
        for r in range(grid.shape[0]):
            for k in range(grid.shape[1]):
                colour = "white" if grid[r, k] > grid.max() / 2 else "black"
                ax.text(k, r, str(int(grid[r, k])), ha="center", va="center", fontsize=8, color=colour)


def _colours(n: int) -> list[tuple[float, float, float, float]]:
    from matplotlib import colormaps

    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]
