"""The comparison's plots: a change-from-base heatmap (strategies x families, one panel per
metric) and a forgetting-against-learning scatter with the Pareto front.

matplotlib is imported here only, with the Agg backend: no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eval.study.compare import Comparison
from eval.study.formatting import SPLITS, axis_label, decimals, find_row

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
        (f"all\n{short}", {"scope": "overall", "split": split}) for split, short in SPLITS.items()
    ]
    wanted += [
        (f"{family}\n{short}", {"scope": "family", "family": family, "split": split})
        for family in comparison.families
        for split, short in SPLITS.items()
    ]
    return [(n, w) for n, w in wanted if _row(comparison, axis, comparison.base, **w)]


def plot_heatmap(comparison: Comparison, folder: Path) -> str | None:
    """Change from the base per strategy and family (held-in, held-out) and overall.

    Colour is the change signed so that green is better whatever the metric's direction
    (scaled per panel); the text is the change itself, `*` where its interval excludes 0.

    Returns:
        The PNG's file name, or None when no metric has family values.
    """
    axes = [a for a in comparison.axes if a["primary"] and _columns(comparison, a)]
    strategies = comparison.models[1:]
    if not axes or not strategies:
        return None
    plt = pyplot()
    width = max(len(_columns(comparison, a)) for a in axes)
    fig, panels = plt.subplots(
        len(axes),
        1,
        figsize=(1.1 * width + 3, 0.45 * len(strategies) * len(axes) + 1.3 * len(axes)),
        squeeze=False,
    )
    for panel, axis in zip(panels[:, 0], axes, strict=True):
        columns = _columns(comparison, axis)
        rows = [[_row(comparison, axis, m, **w) for _, w in columns] for m in strategies]
        delta = np.array([[r["delta"] for r in line] for line in rows], dtype=float)
        sign = 1.0 if axis["higher_is_better"] else -1.0
        scale = np.nanmax(np.abs(delta)) or 1.0
        panel.imshow(sign * delta / scale, cmap="RdYlGn", vmin=-1, vmax=1, aspect="auto")
        digits = decimals(axis)
        for i, line in enumerate(rows):
            for j, row in enumerate(line):
                mark = "*" if row["significant"] else ""
                text = f"{row['delta']:+.{digits}f}{mark}"
                panel.text(j, i, text, ha="center", va="center", fontsize=8)
        panel.set_xticks(range(len(columns)), [name for name, _ in columns], fontsize=8)
        overall = sum(where["scope"] == "overall" for _, where in columns)
        panel.axvline(overall - 0.5, color="black", lw=1.5)  # overall | families
        panel.set_yticks(range(len(strategies)), strategies, fontsize=8)
        better = "higher" if axis["higher_is_better"] else "lower"
        title = f"{axis_label(axis)}: change from {comparison.base} ({better} is better)"
        panel.set_title(title, fontsize=9)
    fig.suptitle("Change from the base (green: better; *: 95% interval excludes 0)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(folder / HEATMAP, dpi=110)
    plt.close(fig)
    return HEATMAP


def tradeoff_axes(comparison: Comparison) -> tuple[dict, dict] | None:
    """(learning, forgetting): held-in perplexity (or the first held-in metric) against held-out
    Belebele (or the first other held-out metric), overall values of primary metrics."""

    def overall(axis: dict[str, Any], split: str) -> bool:
        return bool(_row(comparison, axis, comparison.base, scope="overall", split=split))

    primary = [a for a in comparison.axes if a["primary"]]
    held_in = [a for a in primary if overall(a, "held_in")]
    held_out = [a for a in primary if overall(a, "held_out")]
    if not held_in or not held_out:
        return None
    x = next((a for a in held_in if a["kind"] == "ppl"), held_in[0])
    y = next((a for a in held_out if a["kind"] == "belebele"), None)
    y = y or next((a for a in held_out if a is not x), held_out[0])
    return x, y


def pareto_front(gains: np.ndarray) -> list[int]:
    """Indices of the points no other point beats on both gains (higher is better on both)."""
    front = []
    for i, point in enumerate(gains):
        beaten = np.any(np.all(gains >= point, axis=1) & np.any(gains > point, axis=1))
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: gains[i][0])


def plot_tradeoff(comparison: Comparison, folder: Path) -> str | None:
    """Forgetting against learning: one point per model (the base at 0, 0) with its intervals,
    and the Pareto front of the models no other model beats on both.

    Returns:
        The PNG's file name, or None without a held-in and a held-out metric.
    """
    chosen = tradeoff_axes(comparison)
    if chosen is None or len(comparison.models) < 2:
        return None
    (x_axis, y_axis), plt = chosen, pyplot()
    points = []
    for model in comparison.models:
        rx = _row(comparison, x_axis, model, scope="overall", split="held_in")
        ry = _row(comparison, y_axis, model, scope="overall", split="held_out")
        points.append((model, rx, ry))
    xy = np.array([[rx["delta"] or 0.0, ry["delta"] or 0.0] for _, rx, ry in points])
    signs = np.array([1.0 if a["higher_is_better"] else -1.0 for a in (x_axis, y_axis)])
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    for (model, rx, ry), (x, y) in zip(points, xy, strict=True):
        if rx["delta"] is None:
            ax.scatter([0], [0], marker="s", color="black", zorder=3)
        else:
            # A percentile interval need not contain the point change (a ratio-type metric, or
            # float32 resamples of a change with no spread): that whisker is empty, not negative.
            xerr = [[max(0.0, x - rx["ci_low"])], [max(0.0, rx["ci_high"] - x)]]
            yerr = [[max(0.0, y - ry["ci_low"])], [max(0.0, ry["ci_high"] - y)]]
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="o", capsize=3, alpha=0.8, zorder=3)
        ax.annotate(model, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    front = pareto_front(xy * signs)
    ax.plot(xy[front, 0], xy[front, 1], "--", color="grey", label="Pareto front", zorder=2)
    ax.axhline(0, color="black", lw=0.6)
    ax.axvline(0, color="black", lw=0.6)
    for axis, setter, split in (
        (x_axis, ax.set_xlabel, "held-in"),
        (y_axis, ax.set_ylabel, "held-out"),
    ):
        better = "higher" if axis["higher_is_better"] else "lower"
        setter(f"{split} {axis_label(axis)}: change ({better} is better)")
    ax.set_title("Forgetting against learning (changes from the base, 95% intervals)", fontsize=10)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / TRADEOFF, dpi=110)
    plt.close(fig)
    return TRADEOFF
