"""The comparison's plots, drawn through the shared plotting package (surgery.plotting): a
change-from-base heatmap (strategies x families, one panel per metric) and a forgetting (x)
against learning (y) scatter with the Pareto front. Perplexities are shown as ratios to the
base: a change of +18 means little or much depending on a base of 20 or 20,000.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eval.study.compare import OTHERS, Comparison
from eval.study.formatting import FEW, OVERALL, SPLITS, axis_label, decimals, find_row
from eval.study.measures import RATIO_METRICS
from eval.study.stats import MIN_ITEMS
from eval.tasks import KINDS
from surgery.plotting import (
    BASE_COLOUR,
    MIN_FRONT,
    SERIES,
    colour_scale,
    figure,
    heatmap,
    legend_below,
    noise_handle,
    pareto_steps,
    plain_ticks,
    save_figure,
    text_colour_on,
    use_log,
)
from surgery.plotting.handles import cell_text, patch_handle, place_labels, tick_format

HEATMAP = "change_heatmap.png"
TRADEOFF = "tradeoff.png"


def _row(comparison: Comparison, axis: dict[str, Any], model: str, **where: Any):
    return find_row(comparison.rows, axis, model=model, **where)


def _wanted() -> list[tuple[str, dict[str, Any]]]:
    """Every column a heatmap may have, in order: the overall means per split and `others`,
    then (in `_columns`) each family's held-in and held-out."""
    return [
        (f"all\n{short}" if split in SPLITS else short, {"scope": "overall", "split": split})
        for split, short in OVERALL.items()
    ]


def _columns(comparison: Comparison, axes: list[dict[str, Any]]) -> list[tuple[str, dict]]:
    """The columns any of `axes` has a base value in: one set for every panel, so that a
    column lines up across panels (a metric without it leaves the cell blank)."""
    wanted = _wanted() + [
        (f"{family}\n{short}", {"scope": "family", "family": family, "split": split})
        for family in comparison.families
        for split, short in SPLITS.items()
    ]
    return [
        (name, where)
        for name, where in wanted
        if any(_row(comparison, axis, comparison.base, **where) for axis in axes)
    ]


def _is_ratio(axis: dict[str, Any]) -> bool:
    """Perplexities are shown as ratios to the base, other metrics as changes."""
    return axis["metric"] in RATIO_METRICS


def _beyond_noise(row: dict[str, Any], bold: str) -> bool:
    """A cell whose change is called real: bold, on enough items."""
    return bool(row.get(bold)) and not row.get("few_items")


def plot_heatmap(
    comparison: Comparison, folder: Path, bold: str = "significant"
) -> tuple[str | None, str | None]:
    """Change from the base per strategy: overall (held-in, held-out, the suite's `others`)
    and per family (held-in, held-out), one panel per metric, columns aligned across panels.

    Colour is the change signed so that up the colour bar is better whatever the metric's
    direction (a perplexity's by its log ratio to the base), on a scale fitted to the panel's
    changes beyond noise (`row[bold]` on enough items); the others are grey and hatched. The
    text is the change, a perplexity's as a ratio (`0.93`), `‡` on few items.

    Returns:
        The PNG's file name, or None and why.
    """
    if not _heatmap_axes(comparison):
        return None, "No heatmap: no metric has a family or `others` mean."
    save_figure(heatmap_figure(comparison, bold), folder / HEATMAP)
    return HEATMAP, None


def _heatmap_axes(comparison: Comparison) -> list[dict[str, Any]]:
    """The primary metrics with a family or `others` mean: one panel each."""
    return [a for a in comparison.axes if a["primary"] and _columns(comparison, [a])]


def heatmap_figure(comparison: Comparison, bold: str = "significant"):
    """The heatmap of `plot_heatmap` (some metric must have a family or `others` mean).

    Returns:
        the figure, unsaved.
    """
    axes = _heatmap_axes(comparison)
    columns = _columns(comparison, axes)
    strategies = comparison.models[1:]
    height = len(axes) * (0.55 * len(strategies) + 2.4) + 1.6
    fig, panels = figure(
        "full", height, nrows=len(axes), ncols=2, gridspec_kw={"width_ratios": [40, 1]}
    )
    for (panel, bar), axis in zip(panels, axes, strict=True):
        _heatmap_panel(fig, panel, bar, comparison, axis, columns, strategies, bold)
    star = "95% interval excludes 0" if bold == "significant" else "change survives BH"
    missing = any(
        _row(comparison, axis, comparison.base, **where) is None
        for axis in axes
        for _, where in columns
    )
    handles = [noise_handle(hatch=True), patch_handle(f"coloured: {star}")]
    handles += [patch_handle(f"{FEW}: fewer than {MIN_ITEMS} items")]
    legend_below(fig, handles + ([patch_handle("-: not measured")] if missing else []))
    fig.suptitle(f"Change from {comparison.base}, by strategy (rows) and languages (columns)")
    return fig


def _ratio_text(ratio: float) -> str:
    """A ratio in a cell: two digits (0.0028, 3.2, 26), whole above 100 (150, 1,200)."""
    return f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.2g}"


def _heatmap_panel(
    fig, panel, bar, comparison: Comparison, axis, columns, strategies: list[str], bold: str
) -> None:
    """One metric's panel and its colour bar (`bar` left empty when every cell is noise)."""
    rows = [[_row(comparison, axis, m, **w) for _, w in columns] for m in strategies]
    ratio, sign = _is_ratio(axis), 1.0 if axis["higher_is_better"] else -1.0
    gains = np.full((len(strategies), len(columns)), np.nan)
    for i, line in enumerate(rows):
        for j, row in enumerate(line):
            if row is not None and row["delta"] is not None and _beyond_noise(row, bold):
                gains[i, j] = sign * (np.log(row["ratio"]) if ratio else row["delta"])
    scale = colour_scale(gains.ravel())
    # Columns named by split ("in", "out", "others"), their family once below each pair.
    names = [name.split("\n")[-1] for name, _ in columns]
    image = heatmap(panel, gains, strategies, names, scale, lambda _: "", True)
    groups: dict[str, list[int]] = {}
    for j, (name, _) in enumerate(columns):
        if "\n" in name:
            groups.setdefault(name.split("\n")[0], []).append(j)
    for group, members in groups.items():
        where = (sum(members) / len(members), 0)
        panel.annotate(group, where, xycoords=("data", "axes fraction"), xytext=(0, -14),
                       textcoords="offset points", ha="center", va="top")  # fmt: skip
    digits = decimals(axis)
    for i, line in enumerate(rows):
        for j, row in enumerate(line):
            if row is None or row["delta"] is None:
                cell_text(panel, j, i, "-", blank=True)
                continue
            text = _ratio_text(row["ratio"]) if ratio else f"{row['delta']:+.{digits}f}"
            colour = text_colour_on(scale.rgba(gains[i, j]))
            cell_text(panel, j, i, text + (FEW if row.get("few_items") else ""), colour)
    overall = sum(where["scope"] == "overall" for _, where in columns)
    panel.axvline(overall - 0.5, color="white", lw=3)  # overall | families
    better = "higher" if axis["higher_is_better"] else "lower"
    what = "ratio to" if ratio else "change from"
    panel.set_title(f"{axis_label(axis)}: {what} {comparison.base} ({better} is better)")
    if np.isnan(gains).all():
        bar.axis("off")
        return
    # The bar has its own grid slot (not space taken from the panel): columns stay aligned.
    colours = fig.colorbar(image, cax=bar, label=f"{'ratio' if ratio else 'change'}, better ↑")
    # Ticks as the cells write them: a gain back to the ratio or the change.
    if ratio:
        tick_format(colours.ax.yaxis, lambda gain: _ratio_text(np.exp(sign * gain)))
    else:
        tick_format(colours.ax.yaxis, lambda gain: f"{sign * gain:+.3g}")


def tradeoff_axes(comparison: Comparison) -> tuple[dict, dict, str] | None:
    """(learning, cost, its split): held-in perplexity (the kind whose role is learning, or the
    first held-in metric) against Belebele (role cost, or the first other metric) on the suite's
    `others` languages (forgetting), or, without them, on the held-out ones (transfer); overall
    values of primary metrics."""

    def overall(axis: dict[str, Any], split: str) -> bool:
        return bool(_row(comparison, axis, comparison.base, scope="overall", split=split))

    primary = [a for a in comparison.axes if a["primary"]]
    held_in = [a for a in primary if overall(a, "held_in")]
    split = OTHERS if any(overall(a, OTHERS) for a in primary) else "held_out"
    cost = [a for a in primary if overall(a, split)]
    if not held_in or not cost:
        return None
    x = next((a for a in held_in if _role(a) == "learning"), held_in[0])
    y = next((a for a in cost if _role(a) == "cost"), None)
    y = y or next((a for a in cost if a is not x), cost[0])
    return x, y, split


def _role(axis: dict[str, Any]) -> str | None:
    """The trade-off axis the axis's kind is preferred on (`Kind.role`)."""
    kind = KINDS.get(axis["kind"])
    return kind.role if kind else None


def pareto_front(gains: np.ndarray) -> list[int]:
    """Indices of the points no other point beats on both gains (higher is better on both)."""
    front = []
    for i, point in enumerate(gains):
        beaten = np.any(np.all(gains >= point, axis=1) & np.any(gains > point, axis=1))
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: gains[i][0])


def _coordinate(axis: dict[str, Any], row: dict[str, Any]) -> tuple[float, float, float]:
    """A model's position on one axis and its interval: a perplexity's ratio to the base (the
    base at 1), else its change (the base at 0)."""
    if row["delta"] is None:
        return (1.0, 1.0, 1.0) if _is_ratio(axis) else (0.0, 0.0, 0.0)
    if _is_ratio(axis):
        return row["ratio"], row["ratio_low"], row["ratio_high"]
    return row["delta"], row["ci_low"], row["ci_high"]


def plot_tradeoff(
    comparison: Comparison, folder: Path, bold: str = "significant"
) -> tuple[str | None, str | None]:
    """Forgetting (the suite's `others`; x) against learning (held-in; y), or without
    `others` transfer (held-out) against learning: one point per model (the base at no change)
    with its intervals, and the Pareto front of the models no other model beats on both, as
    steps (only with 3 points or more). A ratio axis is logarithmic only where it spans more
    than `LOG_SPAN`.

    Returns:
        The PNG's file name, or None and why.
    """
    chosen = tradeoff_axes(comparison)
    if chosen is None:
        return None, (
            "No trade-off plot: it needs a metric measured on held-in languages and on "
            "`others:` or held-out ones, and this suite has "
            + (
                "no held-in languages."
                if not _has_split(comparison, "held_in")
                else "neither `others:` nor held-out languages."
            )
        )
    save_figure(tradeoff_figure(comparison), folder / TRADEOFF)
    return TRADEOFF, None


def tradeoff_figure(comparison: Comparison):
    """The trade-off plot of `plot_tradeoff` (`tradeoff_axes` must find its axes).

    Returns:
        the figure, unsaved.
    """
    learning, cost, split = tradeoff_axes(comparison)
    points = []
    for model in comparison.models:
        rx = _row(comparison, cost, model, scope="overall", split=split)
        ry = _row(comparison, learning, model, scope="overall", split="held_in")
        points.append((model, _coordinate(cost, rx), _coordinate(learning, ry)))
    fig, ((ax,),) = figure("full", 9.5)
    for i, (_, (x, x_low, x_high), (y, y_low, y_high)) in enumerate(points):
        colour = BASE_COLOUR if i == 0 else SERIES[(i - 1) % len(SERIES)]
        # A percentile interval need not contain the point change (a ratio-type metric, or
        # float32 resamples of a change with no spread): that whisker is empty, not negative.
        xerr = [[max(0.0, x - x_low)], [max(0.0, x_high - x)]]
        yerr = [[max(0.0, y - y_low)], [max(0.0, y_high - y)]]
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="s" if i == 0 else "o", color=colour,
                    capsize=2, zorder=3)  # fmt: skip
    xy = np.array([[x[0], y[0]] for _, x, y in points])
    gains = np.column_stack([_gain(a, xy[:, i]) for i, a in enumerate((cost, learning))])
    front = pareto_front(gains)
    pareto_steps(
        ax,
        list(xy[front, 0]),
        list(xy[front, 1]),
        learning["higher_is_better"],
        "Pareto front",
        higher_x_better=cost["higher_is_better"],
    )
    names = {"held_in": "held-in", "held_out": "held-out", OTHERS: "others"}
    for axis, part, where in ((cost, "x", split), (learning, "y", "held_in")):
        _scale(ax, part, axis, [p[1 if part == "x" else 2] for p in points])
        better = "higher" if axis["higher_is_better"] else "lower"
        what = "ratio to the base" if _is_ratio(axis) else "change from the base"
        label = f"{names[where]} {axis_label(axis)}: {what} ({better} is better)"
        (ax.set_ylabel if part == "y" else ax.set_xlabel)(label)
    ends = [
        xy
        for _, (x, x_low, x_high), (y, y_low, y_high) in points
        for xy in ((x_low, y), (x_high, y), (x, y_low), (x, y_high))
    ]
    title = (
        "Forgetting (others) against learning (held-in)"
        if split == OTHERS
        else "Transfer (held-out) against learning (held-in)"
    )
    ax.set_title(f"{title}, 95% intervals")
    if len(front) >= MIN_FRONT:
        legend_below(fig, ax.get_legend_handles_labels()[0])
    place_labels(fig, ax, [(p[1][0], p[2][0]) for p in points], [p[0] for p in points], ends)
    return fig


def _scale(ax, part: str, axis: dict[str, Any], extents: list[tuple[float, ...]]) -> None:
    """The no-change line (a ratio's 1, a change's 0) and, for a ratio spanning more than
    `LOG_SPAN`, a log scale; plain tick labels either way."""
    ratio = _is_ratio(axis)
    (ax.axhline if part == "y" else ax.axvline)(1.0 if ratio else 0.0, color="black", lw=0.6)
    if ratio and use_log([v for extent in extents for v in extent]):
        (ax.set_yscale if part == "y" else ax.set_xscale)("log")
    plain_ticks(ax, part)


def _gain(axis: dict[str, Any], values: np.ndarray) -> np.ndarray:
    """Positions as gains, higher better: a ratio's log, signed by the metric's direction."""
    sign = 1.0 if axis["higher_is_better"] else -1.0
    return sign * (np.log(values) if _is_ratio(axis) else values)


def _has_split(comparison: Comparison, split: str) -> bool:
    return any(r["split"] == split for r in comparison.rows)
