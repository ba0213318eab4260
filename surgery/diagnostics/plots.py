"""PNG plots for the diagnostics: titled, labelled, with legends, saved next to the data.

matplotlib is imported here only, and with the Agg backend: no display needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from surgery.core.errors import OutputError
from surgery.diagnostics.metric_kinds import is_perplexity, leaf, lower_is_better

# What a plot option may be called: formats matplotlib's Agg backend writes, chosen by suffix.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def check_plot_path(path: str | Path) -> None:
    """Refuse a plot file name whose suffix is not a format the plots are written in (a missing
    suffix included: matplotlib would silently add .png), before any work.

    Raises:
        OutputError: with the suffixes allowed.
    """
    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise OutputError(f"plot {path}: give a file name ending in {', '.join(PLOT_SUFFIXES)}")


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(metrics: Sequence[str]) -> dict[str, list[str]]:
    """Metrics grouped by kind (their last name part), in order: one panel per kind, so the
    forgetting and the learning metric (`gen/gen/ppl`, `heldin/sla1/ppl`) share an axis."""
    panels: dict[str, list[str]] = {}
    for metric in metrics:
        panels.setdefault(leaf(metric), []).append(metric)
    return panels


def _plain_ticks(ax) -> None:
    """Tick labels as plain numbers (4.7, 12, 1,000): never an offset (`+2.186`) or a power of
    ten (`1.955x10^0`). A log axis (only for a range of a decade or more) labels its decades."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def plain(value: float, _position: object) -> str:
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"

    ax.yaxis.set_major_formatter(FuncFormatter(plain))
    ax.yaxis.set_minor_formatter(NullFormatter())


def alpha_label(layers: str | None = None, modules: str | None = None) -> str:
    """The alpha axis's label, saying what alpha 0 is: BASE, or with a layer spec or module
    filter BASE only there (TRAINED elsewhere); alpha 1 is TRAINED either way."""
    if layers is None and modules is None:
        return "alpha (0 = base, 1 = trained)"
    where = f"layers {layers}" if layers is not None else "every layer"
    if modules is not None:
        where = f"{modules} of {where}"
    return f"alpha (0 = base in {where}, 1 = trained)"


def metrics_figure(
    rows: Sequence[dict], metrics: Sequence[str], title: str, xlabel: str | None = None
):
    """The figure of `plot_metrics_vs_alpha` (not saved): one panel per metric kind, a line per
    task in it, against alpha (`xlabel`: the axis's label, default `alpha_label()`)."""
    plt = pyplot()
    panels = _panels(metrics)
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.4 * nrows), squeeze=False)
    alphas = [row["alpha"] for row in rows]
    for ax, (kind, members) in zip(axes.flat, panels.items(), strict=False):
        values = [[row[m] for row in rows] for m in members]
        for metric, line in zip(members, values, strict=True):
            ax.plot(alphas, line, marker="o", label=metric.rsplit("/", 1)[0])
        flat = [v for line in values for v in line]
        # Perplexities spanning an order of magnitude or more (along the sweep, or between the
        # tasks sharing the panel) get a log axis.
        if is_perplexity(members[0]) and min(flat) > 0 and max(flat) >= 10 * min(flat):
            ax.set_yscale("log")
        _plain_ticks(ax)
        better = "lower" if lower_is_better(members[0]) else "higher"
        ax.set_title(f"{kind} ({better} is better)")
        ax.set_xlabel(xlabel or alpha_label())
        ax.set_ylabel(kind)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # leave the suptitle its own room
    return fig


def plot_metrics_vs_alpha(
    rows: Sequence[dict], metrics: Sequence[str], path: Path, title: str, xlabel: str | None = None
) -> Path:
    """One panel per metric kind (ppl, bits_per_byte, acc...) against alpha (0 = BASE, 1 =
    TRAINED; `xlabel` from `alpha_label` says where BASE is when only some layers blend), one
    line per task: what training forgot and what it learned side by side."""
    fig = metrics_figure(rows, metrics, title, xlabel)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_drift_by_layer(layer_kinds: dict[tuple[int, str], float], path: Path, title: str) -> Path:
    """Grouped bars: relative L2 drift per layer, one bar per module kind."""
    plt = pyplot()
    layers = sorted({layer for layer, _ in layer_kinds})
    kinds = sorted({kind for _, kind in layer_kinds})
    width = 0.8 / max(1, len(kinds))
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(layers) + 2), 3.8))
    for i, kind in enumerate(kinds):
        xs = [layer + (i - (len(kinds) - 1) / 2) * width for layer in layers]
        ax.bar(xs, [layer_kinds.get((layer, kind), 0.0) for layer in layers], width, label=kind)
    ax.set_xlabel("layer")
    ax.set_ylabel("relative L2 drift ||θ-θ0|| / ||θ0||")
    ax.set_title(title)
    ax.set_xticks(layers)
    ax.legend(loc="best", fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# The background of a heatmap cell without a value (a recovery within noise).
WITHIN_NOISE_COLOUR = "#d9d9d9"


def heatmap_cell(value: float) -> tuple[str, str]:
    """The text of a heatmap cell and its colour, readable on the cell's background: black on
    the light within-noise grey, the bright end of viridis and the pink above 1; white on the
    dark rest."""
    if math.isnan(value):
        return "noise", "black"
    text = f"{value:.2f}"
    if value < 0 or value > 1:
        text = ("< " if value < 0 else "> ") + text
    return text, "black" if value > 0.6 else "white"


def plot_heatmap(
    values: list[list[float]],
    rows: Sequence[str],
    cols: Sequence[str],
    path: Path,
    title: str,
    label: str,
) -> Path:
    """A labelled heatmap of values meant to lie in [0, 1] (recoveries) on a fixed 0-1 colour
    scale, the value written in each cell; values outside the scale get their own colours and a
    marker (< or >) next to the number, so 0.15 never looks like full recovery."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(cols) + 2.5), max(2.5, 0.5 * len(rows) + 1.5)))
    import numpy as np

    grid = np.ma.masked_invalid(np.array(values, dtype=float))  # NaN: within noise
    cmap = plt.get_cmap("viridis").with_extremes(
        under="#7b2d26",  # below 0: reverting made it worse than TRAINED
        over="#f4a6a6",  # above 1: better than BASE
        bad=WITHIN_NOISE_COLOUR,
    )
    image = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(cols)), labels=cols, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), labels=rows)
    for r, row in enumerate(values):
        for c, value in enumerate(row):
            text, colour = heatmap_cell(value)
            ax.text(c, r, text, ha="center", va="center", color=colour, fontsize="small")
    fig.colorbar(image, ax=ax, label=f"{label} (fixed scale 0 to 1)", extend="both")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _noise_band(metric: str, trained: float, noise: float) -> tuple[float, float]:
    """TRAINED's score plus and minus the noise floor, back on the metric's own scale (the
    floor of a perplexity is on the log scale)."""
    if is_perplexity(metric):
        return trained * math.exp(-noise), trained * math.exp(noise)
    return trained - noise, trained + noise


def plot_window_curve(
    rows: Sequence[dict],
    references: dict[str, tuple[float, float, float]],
    path: Path,
    title: str,
) -> Path:
    """One panel per metric: its score with each sliding window reverted, against the window's
    centre layer (a line per alpha), with BASE's and TRAINED's scores as dashed lines and
    TRAINED's noise floor shaded: a window whose point leaves the band moves the metric.

    Args:
        rows: localize's rows of a window run (`start`, `end`, `alpha`, each metric).
        references: per metric to draw, (BASE's score, TRAINED's score, noise on the judged
            scale).
    """
    plt = pyplot()
    metrics = list(references)
    cols = 2 if len(metrics) == 4 else min(3, len(metrics))  # four: a square
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.8 * cols, 3.4 * nrows), squeeze=False)
    width = rows[0]["end"] - rows[0]["start"]
    for ax, metric in zip(axes.flat, metrics, strict=False):
        base, trained, noise = references[metric]
        for alpha in dict.fromkeys(row["alpha"] for row in rows):
            points = [row for row in rows if row["alpha"] == alpha]
            centres = [(row["start"] + row["end"] - 1) / 2 for row in points]
            label = "window reverted" if alpha == 0 else f"window at alpha {alpha:g}"
            ax.plot(centres, [row[metric] for row in points], marker="o", label=label)
        ax.axhline(base, color="tab:green", linestyle="--", label="base")
        ax.axhline(trained, color="tab:red", linestyle="--", label="trained")
        ax.axhspan(*_noise_band(metric, trained, noise), color="tab:red", alpha=0.12, lw=0)
        _plain_ticks(ax)
        better = "lower" if lower_is_better(metric) else "higher"
        ax.set_title(f"{metric}\n({better} is better)", fontsize="small")
        ax.set_xlabel(f"centre layer of the {width}-layer window")
        ax.set_ylabel(leaf(metric))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.suptitle(f"{title}\n(shaded: trained's noise floor)")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cosine_cell(value: float) -> tuple[str, str]:
    """A cosine cell's text and its colour, readable on RdBu's dark ends and light middle."""
    if math.isnan(value):
        return "", "black"
    return f"{value:.2f}", "white" if abs(value) > 0.6 else "black"


def plot_matrices(
    panels: dict[str, Sequence[Sequence[float]]],
    labels: Sequence[str],
    path: Path,
    title: str,
    label: str,
) -> Path:
    """N x N heatmaps side by side (one per panel title) on one fixed -1 to 1 scale, the value
    written in each cell, so panels and figures compare by colour."""
    plt = pyplot()
    n = len(labels)
    side = max(2.6, 0.55 * n + 1.4)
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(side * len(panels) + 1.6, side + 0.8),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for number, (ax, (name, matrix)) in enumerate(zip(axes.flat, panels.items(), strict=True)):
        image = ax.imshow(matrix, cmap="RdBu", vmin=-1.0, vmax=1.0)
        ax.set_xticks(range(n), labels=labels, rotation=35, ha="right")
        # The rows are the same experts in every panel: named once, on the left.
        ax.set_yticks(range(n), labels=labels if number == 0 else [])
        for r, row in enumerate(matrix):
            for c, value in enumerate(row):
                text, colour = _cosine_cell(float(value))
                ax.text(c, r, text, ha="center", va="center", color=colour, fontsize="small")
        ax.set_title(name)
    fig.colorbar(image, ax=list(axes.flat), label=f"{label} (fixed scale -1 to 1)", shrink=0.8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_layer_heatmap(
    rows: dict[str, Sequence[float]], layers: Sequence[int], path: Path, title: str, label: str
) -> Path:
    """A heatmap with a column per layer and a row per named series (NaN: no value, blank), on a
    fixed -1 to 1 scale."""
    plt = pyplot()
    import numpy as np

    fig, ax = plt.subplots(figsize=(max(5, 0.55 * len(layers) + 2.5), 0.5 * len(rows) + 1.6))
    grid = np.ma.masked_invalid(np.array(list(rows.values()), dtype=float))
    cmap = plt.get_cmap("RdBu").with_extremes(bad=WITHIN_NOISE_COLOUR)
    image = ax.imshow(grid, cmap=cmap, vmin=-1.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(layers)), labels=[str(layer) for layer in layers])
    ax.set_yticks(range(len(rows)), labels=list(rows))
    ax.set_xlabel("layer")
    if len(layers) <= 40:  # beyond that the numbers no longer fit their cells
        for r, values in enumerate(rows.values()):
            for c, value in enumerate(values):
                text, colour = _cosine_cell(float(value))
                ax.text(c, r, text, ha="center", va="center", color=colour, fontsize="x-small")
    fig.colorbar(image, ax=ax, label=f"{label} (fixed scale -1 to 1)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
