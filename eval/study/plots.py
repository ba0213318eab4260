"""The comparison's plots: a change-from-base heatmap (strategies x families, one panel per
metric) and a forgetting-against-learning scatter with the Pareto front. Perplexities are shown
as ratios to the base (on a log scale in the scatter): a change of +18 means little or much
depending on a base of 20 or 20,000.

matplotlib is imported here only, with the Agg backend: no display needed.
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

HEATMAP = "change_heatmap.png"
TRADEOFF = "tradeoff.png"


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _row(comparison: Comparison, axis: dict[str, Any], model: str, **where: Any):
    return find_row(comparison.rows, axis, model=model, **where)


def _columns(comparison: Comparison, axis: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    wanted = [
        (f"all\n{short}" if split in SPLITS else short, {"scope": "overall", "split": split})
        for split, short in OVERALL.items()
    ]
    wanted += [
        (f"{family}\n{short}", {"scope": "family", "family": family, "split": split})
        for family in comparison.families
        for split, short in SPLITS.items()
    ]
    return [(n, w) for n, w in wanted if _row(comparison, axis, comparison.base, **w)]


def _is_ratio(axis: dict[str, Any]) -> bool:
    """Perplexities are shown as ratios to the base (on a log scale), other metrics as changes."""
    return axis["metric"] in RATIO_METRICS


def _marks(row: dict[str, Any], bold: str) -> str:
    few = row.get("few_items")
    return ("*" if row.get(bold) and not few else "") + (FEW if few else "")


def plot_heatmap(
    comparison: Comparison, folder: Path, bold: str = "significant"
) -> tuple[str | None, str | None]:
    """Change from the base per strategy: overall (held-in, held-out, the suite's `others`)
    and per family (held-in, held-out).

    Colour is the change signed so that green is better whatever the metric's direction
    (scaled per panel; a perplexity's by its log ratio to the base); the text is the change
    itself, a perplexity's as a ratio (`×0.93`), `*` where `row[bold]`, `‡` on few items.

    Returns:
        The PNG's file name, or None and why.
    """
    axes = [a for a in comparison.axes if a["primary"] and _columns(comparison, a)]
    strategies = comparison.models[1:]
    if not axes:
        return None, "No heatmap: no metric has a family or `others` mean."
    plt = pyplot()
    width = max(len(_columns(comparison, a)) for a in axes)
    fig, panels = plt.subplots(
        len(axes),
        1,
        figsize=(1.1 * width + 3, 0.45 * len(strategies) * len(axes) + 1.3 * len(axes)),
        squeeze=False,
    )
    for panel, axis in zip(panels[:, 0], axes, strict=True):
        _heatmap_panel(panel, comparison, axis, strategies, bold)
    legend = "*: 95% interval excludes 0" if bold == "significant" else "*: survives BH"
    fig.suptitle(
        f"Change from the base (green: better; {legend}; {FEW}: fewer than {MIN_ITEMS} items)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(folder / HEATMAP, dpi=110)
    plt.close(fig)
    return HEATMAP, None


def _heatmap_panel(panel, comparison: Comparison, axis, strategies: list[str], bold: str) -> None:
    columns = _columns(comparison, axis)
    rows = [[_row(comparison, axis, m, **w) for _, w in columns] for m in strategies]
    ratio = _is_ratio(axis)
    key = "ratio" if ratio else "delta"
    shown = np.array([[r[key] for r in line] for line in rows], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.log(shown) if ratio else shown
    sign = 1.0 if axis["higher_is_better"] else -1.0
    scale = np.nanmax(np.abs(change)) or 1.0
    panel.imshow(sign * change / scale, cmap="RdYlGn", vmin=-1, vmax=1, aspect="auto")
    digits = decimals(axis)
    for i, line in enumerate(rows):
        for j, row in enumerate(line):
            text = f"×{row['ratio']:#.3g}" if ratio else f"{row['delta']:+.{digits}f}"
            panel.text(j, i, text + _marks(row, bold), ha="center", va="center", fontsize=8)
    panel.set_xticks(range(len(columns)), [name for name, _ in columns], fontsize=8)
    overall = sum(where["scope"] == "overall" for _, where in columns)
    panel.axvline(overall - 0.5, color="black", lw=1.5)  # overall | families
    panel.set_yticks(range(len(strategies)), strategies, fontsize=8)
    better = "higher" if axis["higher_is_better"] else "lower"
    what = "ratio to" if ratio else "change from"
    title = f"{axis_label(axis)}: {what} {comparison.base} ({better} is better)"
    panel.set_title(title, fontsize=9)


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
    """Forgetting (the suite's `others`) against learning (held-in), or without `others`
    transfer (held-out) against learning: one point per model (the base at no change) with
    its intervals, and the Pareto front of the models no other model beats on both.

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
    (x_axis, y_axis, split), plt = chosen, pyplot()
    points = []
    for model in comparison.models:
        rx = _row(comparison, x_axis, model, scope="overall", split="held_in")
        ry = _row(comparison, y_axis, model, scope="overall", split=split)
        points.append((model, _coordinate(x_axis, rx), _coordinate(y_axis, ry)))
    xy = np.array([[x[0], y[0]] for _, x, y in points])
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    for i, (model, (x, x_low, x_high), (y, y_low, y_high)) in enumerate(points):
        if i == 0:
            ax.scatter([x], [y], marker="s", color="black", zorder=3)
        else:
            # A percentile interval need not contain the point change (a ratio-type metric, or
            # float32 resamples of a change with no spread): that whisker is empty, not negative.
            xerr = [[max(0.0, x - x_low)], [max(0.0, x_high - x)]]
            yerr = [[max(0.0, y - y_low)], [max(0.0, y_high - y)]]
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="o", capsize=3, alpha=0.8, zorder=3)
        ax.annotate(model, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    gains = np.column_stack([_gain(a, xy[:, i]) for i, a in enumerate((x_axis, y_axis))])
    front = pareto_front(gains)
    ax.plot(xy[front, 0], xy[front, 1], "--", color="grey", label="Pareto front", zorder=2)
    names = {"held_in": "held-in", "held_out": "held-out", OTHERS: "others"}
    for axis, part, where in ((x_axis, "x", "held_in"), (y_axis, "y", split)):
        ratio = _is_ratio(axis)
        (ax.axhline if part == "y" else ax.axvline)(1.0 if ratio else 0.0, color="black", lw=0.6)
        if ratio:
            _log_scale(ax, part)
        better = "higher" if axis["higher_is_better"] else "lower"
        what = "ratio to the base, log scale" if ratio else "change"
        label = f"{names[where]} {axis_label(axis)}: {what} ({better} is better)"
        (ax.set_ylabel if part == "y" else ax.set_xlabel)(label, fontsize=9)
    title = (
        "Forgetting (others) against learning (held-in)"
        if split == OTHERS
        else "Transfer (held-out) against learning (held-in)"
    )
    ax.set_title(f"{title}, 95% intervals", fontsize=10)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / TRADEOFF, dpi=110)
    plt.close(fig)
    return TRADEOFF, None


def _log_scale(ax, part: str) -> None:
    """A log scale labelled with plain ratios (0.8, 0.9, 1): within a decade, ticks at round
    ratios (a log scale's default would label none but 1)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

    (ax.set_yscale if part == "y" else ax.set_xscale)("log")
    axis, limits = (ax.yaxis, ax.get_ylim()) if part == "y" else (ax.xaxis, ax.get_xlim())
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    low, high = limits
    if high / low < 10:
        ticks = [v for v in MaxNLocator(6).tick_values(low, high) if low <= v <= high]
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_minor_locator(NullLocator())


def _gain(axis: dict[str, Any], values: np.ndarray) -> np.ndarray:
    """Positions as gains, higher better: a ratio's log, signed by the metric's direction."""
    sign = 1.0 if axis["higher_is_better"] else -1.0
    return sign * (np.log(values) if _is_ratio(axis) else values)


def _has_split(comparison: Comparison, split: str) -> bool:
    return any(r["split"] == split for r in comparison.rows)
