"""The diagnostics' heatmaps (localize's recoveries, task-vector cosines by region and by layer),
drawn through the shared plotting package on colour scales fitted to the data.

Each has a `*_figure` function (not saved: the figure check renders it) and a `plot_*` one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from surgery.diagnostics.plots import distinct_metrics, task_label
from surgery.plotting import (
    colour_bar,
    colour_scale,
    figure,
    heatmap,
    legend_below,
    mask_diagonal,
    noise_handle,
    save_figure,
)

# A heatmap cell narrower than this (cm) cannot hold its number at the house font size.
MIN_CELL_CM = 0.9
# The width the cells of a page-wide heatmap share (cm): the page less labels and colour bar.
CELLS_CM = 13.0


def block_name(block: str) -> str:
    """A localize block as a reader names it: `0:2` -> `layers 0-1`, `5` -> `layer 5`; a band's
    counts kept (`layers 9-27 (first 9, last 6)`)."""
    match = re.fullmatch(r"(\d+):(\d+)(.*)", block)
    if match:
        start, end, rest = int(match[1]), int(match[2]), match[3]
        span = f"layer {start}" if end - start == 1 else f"layers {start}-{end - 1}"
        return span + rest
    return f"layer {block}" if block.isdigit() else block


def recovery_figure(
    rows: Sequence[dict], metrics: Sequence[str], blocks: Sequence[str], title: str
):
    """The figure of `plot_recovery` (not saved): a row per reverted block, a column per
    distinct metric, each cell its recovery (0 = as trained, 1 = as base) on a scale fitted to
    the values, centred on 0 when a block makes things worse; within-noise cells grey and
    hatched, explained in the legend. `blocks`: each row's block as localize prints it."""
    drawn = distinct_metrics(metrics)
    alphas = {row["alpha"] for row in rows}
    names = [
        block_name(block) + ("" if alphas == {0} else f" at alpha {row['alpha']:g}")
        for block, row in zip(blocks, rows, strict=True)
    ]
    values = [[row[f"recovery/{m}"] for m in drawn] for row in rows]
    cols = [f"{task_label(m, drawn)}\n{m.rsplit('/', 1)[-1].replace('_', ' ')}" for m in drawn]
    # As wide as the columns need, up to the page: one metric is not a page-wide bar.
    fig, axes = figure(min(17.0, 9.0 + 2.5 * len(cols)), 3.2 + 0.8 * len(rows))
    ax = axes[0, 0]
    scale = colour_scale(values)
    image = heatmap(ax, values, names, cols, scale, hatch_nan=True)
    ax.xaxis.tick_top()
    colour_bar(fig, image, ax, "recovery\n(0 = trained, 1 = base)")
    if any(math.isnan(v) for row in values for v in row):
        legend_below(fig, [noise_handle(hatch=True)])
    reverted = "reverted to base" if alphas == {0} else "blended toward base"
    ax.set_title(f"{title}\n(each block {reverted} alone)")
    return fig


def plot_recovery(
    rows: Sequence[dict], metrics: Sequence[str], blocks: Sequence[str], path: Path, title: str
) -> Path:
    """A recovery heatmap of localize's block rows (`recovery_figure`), saved at `path`."""
    return save_figure(recovery_figure(rows, metrics, blocks, title), path)


def _panel_grid(count: int, n: int) -> tuple[int, int]:
    """(rows, columns) of `count` n x n panels, as many a row as keep a cell `MIN_CELL_CM`
    wide, balanced."""
    per_row = max(1, min(count, int(CELLS_CM // (n * MIN_CELL_CM + 1.0))))
    rows = math.ceil(count / per_row)
    return rows, math.ceil(count / rows)


def matrices_figure(
    panels: dict[str, Sequence[Sequence[float]]], labels: Sequence[str], title: str, label: str
):
    """The figure of `plot_matrices` (not saved): N x N heatmaps, one per panel title, their
    diagonals (an expert with itself) masked, on one scale fitted to every panel's values."""
    n = len(labels)
    rows, cols = _panel_grid(len(panels), n)
    masked = {name: mask_diagonal(matrix) for name, matrix in panels.items()}
    scale = colour_scale([masked[name] for name in masked], bad="white")
    fig, axes = figure("full", (n * 0.8 + 1.2) * rows + 2.5, rows, cols, sharex=True, sharey=True)
    image = None
    for ax, (name, matrix) in zip(axes.flat, masked.items(), strict=False):
        image = heatmap(ax, matrix, labels, labels, scale)
        ax.tick_params(axis="x", labelrotation=90)
        ax.set_title(name)
    for ax in list(axes.flat)[len(panels) :]:
        fig.delaxes(ax)
    colour_bar(fig, image, [ax for ax in axes.flat if ax.figure is fig], label)
    fig.suptitle(title)
    return fig


def plot_matrices(
    panels: dict[str, Sequence[Sequence[float]]],
    labels: Sequence[str],
    path: Path,
    title: str,
    label: str,
) -> Path:
    """N x N heatmaps side by side (one per panel title) on one scale fitted to their values
    (the diagonal masked), the value written in each cell, so panels compare by colour."""
    return save_figure(matrices_figure(panels, labels, title, label), path)


def layer_heatmap_figure(
    rows: dict[str, Sequence[float]], layers: Sequence[int], title: str, label: str
):
    """The figure of `plot_layer_heatmap` (not saved): a column per layer, a row per named
    series, on a scale fitted to the values; numbers written while the cells can hold them."""
    values = list(rows.values())
    scale = colour_scale(values, bad="white")
    fig, axes = figure("full", 2.8 + 0.7 * len(rows))
    ax = axes[0, 0]
    readable = len(layers) * MIN_CELL_CM <= CELLS_CM
    image = heatmap(
        ax,
        values,
        list(rows),
        [str(layer) for layer in layers],
        scale,
        None if readable else (lambda _value: ""),
    )
    if not readable:  # label every k-th layer: the numbers would run into each other
        step = math.ceil(len(layers) / 20)
        ax.set_xticks(range(0, len(layers), step), labels=[str(n) for n in layers[::step]])
    ax.set_xlabel("layer")
    colour_bar(fig, image, ax, label)
    ax.set_title(title)
    return fig


def plot_layer_heatmap(
    rows: dict[str, Sequence[float]], layers: Sequence[int], path: Path, title: str, label: str
) -> Path:
    """A heatmap with a column per layer and a row per named series (NaN: no value, blank)."""
    return save_figure(layer_heatmap_figure(rows, layers, title, label), path)
