"""The demo's strategies chart (strategies.png), drawn through the shared plotting package
(surgery.plotting): one panel per column of the report's table, each strategy's change from
the base with its 95% interval.

Colours: better than the base, worse, and the one "within noise" grey; a column whose changes
did not hold across seeds is hatched and says so in the legend.
"""

from __future__ import annotations

from dataclasses import dataclass

from surgery.plotting import (
    NOISE_COLOUR,
    colour_scale,
    figure,
    legend_below,
    noise_handle,
    plain_ticks,
    use_log,
)
from surgery.plotting.handles import patch_handle
from surgery.plotting.ticks import log_ticks

# What a chrF change is measured in: points of the 0-100 score.
UNITS = {"chrf": "chrF points (0-100)", "copain": "accuracy points (%)"}
ONE_DRAW_HATCH = "///"


@dataclass(frozen=True)
class Panel:
    """One column of the table as a panel: its title, whether lower is better, whether it is
    a perplexity (a ratio to the base), whether its changes held across seeds, and the
    comparison's cell of each strategy."""

    label: str
    task: str
    lower_is_better: bool
    ppl: bool
    held_across_seeds: bool
    cells: list[dict]


def bar_extent(c: dict, ppl: bool) -> tuple[float, float, float]:
    """A cell as a bar: (length, low, high). Perplexity: its ratio to the base with the
    ratio's own bootstrap interval (the comparison's), drawn from 1 since perplexities move by
    orders of magnitude; other measures: the change from the base and its interval."""
    if ppl:
        return c["ratio"], c["ratio_low"], c["ratio_high"]
    return c["delta"], c["ci_low"], c["ci_high"]


def _colours():
    """Better and worse: the ends of the house diverging scale (better up, as in compare's
    heatmap)."""
    scale = colour_scale([-1.0, 1.0])
    return scale.rgba(0.7), scale.rgba(-0.7)


def strategies_figure(labels: list[str], panels: list[Panel]):
    """Two panels a row, the strategies down the shared y axis: each strategy's change from
    the base with its 95% interval (perplexity: its ratio to the base, on a log axis where it
    spans more than 3x); grey within noise, hatched where the column's changes did not hold
    across seeds.

    Returns:
        the figure, unsaved.
    """
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig, grid = figure(
        "full", rows * (0.42 * len(labels) + 2.2) + 1.4, nrows=rows, ncols=columns, sharey=True
    )
    for ax, panel in zip(grid.flat, panels, strict=False):
        _panel(ax, labels, panel)
    for ax in list(grid.flat)[len(panels) :]:
        ax.remove()  # no empty grid slot
    grid.flat[0].invert_yaxis()  # shared: the first strategy on top
    noise = any(not c["significant"] for p in panels for c in p.cells)
    legend_below(fig, _handles(noise, any(not p.held_across_seeds for p in panels)))
    fig.suptitle("Each strategy against the base: change and 95% interval")
    return fig


def _panel(ax, labels: list[str], panel: Panel) -> None:
    better, worse = _colours()
    bars = [bar_extent(c, panel.ppl) for c in panel.cells]
    origin = 1.0 if panel.ppl else 0.0
    lengths = [b[0] for b in bars]
    # Whiskers never negative: a percentile interval need not contain the point.
    errors = [[max(0.0, b[0] - b[1]) for b in bars], [max(0.0, b[2] - b[0]) for b in bars]]
    good = [(n < origin) if panel.lower_is_better else (n > origin) for n in lengths]
    colours = [
        (better if g else worse) if c["significant"] else NOISE_COLOUR
        for g, c in zip(good, panel.cells, strict=True)
    ]
    hatch = None if panel.held_across_seeds else ONE_DRAW_HATCH
    style = {"xerr": errors, "color": colours, "capsize": 2, "hatch": hatch, "edgecolor": "white"}
    style["error_kw"] = {"elinewidth": 0.8}
    log = panel.ppl and use_log([v for b in bars for v in b] + [origin])
    ax.barh(labels, [n - origin for n in lengths], left=origin, **style)
    if log:
        log_ticks(ax, "x", [v for b in bars for v in b] + [origin])
    else:
        plain_ticks(ax, "x")
    if panel.ppl:
        ax.set_xlabel("ratio to the base" + (" (log scale)" if log else ""))
    else:
        ax.set_xlabel(f"change, {UNITS.get(panel.task, panel.task)}")
    ax.axvline(origin, color="black", linewidth=0.8)
    better_word = "lower" if panel.lower_is_better else "higher"
    ax.set_title(f"{panel.label} ({better_word} is better)")
    ax.grid(axis="x", alpha=0.3)


def _handles(noise: bool, one_draw: bool) -> list:
    """The legend: every colour drawn, and the hatching where a column is one draw."""
    better, worse = _colours()
    handles = [
        patch_handle("better than the base", better),
        patch_handle("worse than the base", worse),
    ]
    if noise:
        handles.append(noise_handle())
    if one_draw:
        label = "did not hold across seeds: one draw"
        handles.append(patch_handle(label, "white", ONE_DRAW_HATCH, "0.3"))
    return handles
