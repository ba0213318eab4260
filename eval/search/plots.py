"""The search's figure, frontier.png: forgetting (x) against learning (y) on the report half,
drawn through the shared plotting package (surgery.plotting).

Every frontier point carries its trial number (report.md's and the text's name for it), every
baseline its name. BASE usually lies orders of magnitude away (it never saw the languages): a
point that would squash the others is an arrow at the axis edge with its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.study.measures import RATIO_METRICS
from surgery.plotting import (
    BASE_COLOUR,
    BASELINE_COLOUR,
    FRONT_COLOUR,
    LOG_SPAN,
    TRAINED_COLOUR,
    figure,
    legend_below,
    outlier_arrow,
    plain_number,
    plain_ticks,
    save_figure,
    use_log,
)
from surgery.plotting.handles import marker_handle, place_labels
from surgery.plotting.ticks import log_ticks

SPLIT_WORDS = {"held_in": "held-in", "held_out": "held-out", "others": "`others:`"}
METRIC_WORDS = {
    "ppl": "perplexity",
    "word_perplexity": "word perplexity",
    "byte_perplexity": "byte perplexity",
}
# (marker, colour, legend entry) per kind of point.
STYLE = {
    "point": ("o", FRONT_COLOUR, "frontier point (trial number)"),
    "baseline": ("^", BASELINE_COLOUR, "baseline"),
    "trained": ("s", TRAINED_COLOUR, "TRAINED"),
    "base": ("*", BASE_COLOUR, "BASE"),
}
# A mark further than this many widths of the frontier's range beyond it is an edge arrow.
OUTLIER_SPANS = 1.0


@dataclass
class Mark:
    """One model on the plot: where, its interval's half-widths, its kind and label."""

    kind: str
    label: str
    x: float
    xerr: list[list[float]]
    y: float
    yerr: list[list[float]]


def plot_frontier(document: dict[str, Any], path: Path, command: str | None = None) -> Path:
    """frontier.png (`frontier_figure`), saved by `save_figure` with `command` (default: this
    process's command line) and the plotting hash in its metadata; returns `path`."""
    return save_figure(frontier_figure(document), path, command)


def frontier_figure(document: dict[str, Any]):
    """Forgetting (x) against learning (y) on the report half: each point's value with the 95%
    paired interval of its change from TRAINED around it; frontier points numbered, baselines
    named, TRAINED and BASE; a value that would squash the rest drawn as an arrow at the edge
    with its value. Log axes only for perplexities spanning more than `LOG_SPAN`.

    Returns:
        the figure, unsaved.
    """
    learning, forgetting = document["objectives"][:2]
    marks = _marks(document, learning["name"], forgetting["name"])
    fig, ((ax,),) = figure("full", 10.5)
    far = {
        part: _far(marks, part, objective["metric"] in RATIO_METRICS)
        for part, objective in (("x", forgetting), ("y", learning))
    }
    shown = [m for i, m in enumerate(marks) if i not in far["x"] | far["y"]]
    for mark in shown:
        marker, colour, _ = STYLE[mark.kind]
        size = 11 if mark.kind == "base" else 5
        ax.errorbar(mark.x, mark.y, xerr=mark.xerr, yerr=mark.yerr, fmt=marker, color=colour,
                    markersize=size, capsize=2, elinewidth=1, zorder=3)  # fmt: skip
    for part, objective in (("x", forgetting), ("y", learning)):
        _axis(ax, part, objective, shown)
    _arrows(ax, marks, far, "learning", "forgetting")
    reference = reference_name(document)
    ax.set_title(f"Report half; bars: 95% paired interval of the change from {reference}")
    legend_below(fig, _handles({m.kind for m in shown}, reference))
    _label_points(fig, ax, shown)  # last: where the labels fall depends on the final layout
    return fig


def _marks(document: dict[str, Any], learning: str, forgetting: str) -> list[Mark]:
    """The points to draw: frontier points and baselines, TRAINED, BASE (its report values;
    no interval of its own)."""
    references = document["references"]
    reference = reference_name(document)
    trained = {"point": reference, "baseline": None, "report": references["trained"]["report"]}
    base = {"point": "BASE", "baseline": None, "report": references["base"]["report"]}
    # The `trained` (or `soup`) and `base` baselines are the references themselves: drawn once.
    points = [p for p in document["points"] if p["baseline"] not in ("trained", "soup", "base")]
    marks = []
    for point in [*points, trained, base]:
        kind = (
            "trained"
            if point is trained
            else "base"
            if point is base
            else "baseline"
            if point["baseline"]
            else "point"
        )
        label = point["baseline"] or str(point["point"])
        x, xerr = _value_and_error(point["report"][forgetting])
        y, yerr = _value_and_error(point["report"][learning])
        marks.append(Mark(kind, label, x, xerr, y, yerr))
    return marks


def _far(marks: list[Mark], part: str, ratio: bool) -> set[int]:
    """Indices of the marks that would squash the frontier and TRAINED (the figure's subject)
    on one axis: further beyond their range than `OUTLIER_SPANS` times its width (in log for
    a perplexity; the width at least half of `LOG_SPAN`)."""
    values = [(m.x if part == "x" else m.y) for m in marks]
    scaled = [math.log10(v) if ratio and v > 0 else v for v in values]
    core = [v for v, m in zip(scaled, marks, strict=True) if m.kind in ("point", "trained")]
    low, high = min(core), max(core)
    width = max(high - low, math.log10(LOG_SPAN) / 2 if ratio else abs(high) * 0.05 or 1e-9)
    reach = OUTLIER_SPANS * width
    return {i for i, v in enumerate(scaled) if v < low - reach or v > high + reach}


def _arrows(ax, marks: list[Mark], far: dict[str, set[int]], y_role: str, x_role: str) -> None:
    """Each mark off the axes as an arrow at the edge with its values: those above or below
    side by side in headroom made for them (their labels give both values), those only off
    to one side at their own height."""
    above = [m for i, m in enumerate(marks) if i in far["y"]]
    if above:
        # Headroom: the data in the lower (or upper) three quarters, the labels in the rest.
        high = any(m.y > max(ax.get_ylim()) for m in above)
        axis = ax.yaxis.get_transform()
        low, top = (float(axis.transform(v)) for v in sorted(ax.get_ylim()))
        room = 0.3 * (top - low)
        limits = (low, top + room) if high else (low - room, top)
        ax.set_ylim(*(float(axis.inverted().transform(v)) for v in limits))
    for k, mark in enumerate(sorted(above, key=lambda m: m.x)):
        at = _axes_to_data(ax, (k + 0.5) / len(above))
        label = f"{mark.label}: {x_role} {plain_number(mark.x)},\n{y_role}"
        outlier_arrow(ax, "y", mark.y, at, label)
    for i, mark in enumerate(marks):
        if i in far["x"] and i not in far["y"]:
            outlier_arrow(ax, "x", mark.x, mark.y, f"{mark.label}: {x_role}")


def _axes_to_data(ax, share: float) -> float:
    """The x value at `share` of the x axis's length (in its own scale, log or linear)."""
    axis = ax.xaxis.get_transform()
    low, high = (float(axis.transform(v)) for v in ax.get_xlim())
    return float(axis.inverted().transform(low + share * (high - low)))


def _clip(limits: tuple[float, float], value: float) -> float:
    low, high = sorted(limits)
    return min(max(value, low), high)


def _axis(ax, part: str, objective: dict[str, Any], shown: list[Mark]) -> None:
    """An axis's label in words, its scale (log only for a ratio spanning more than
    `LOG_SPAN`, intervals included) and plain tick labels."""
    values = []
    for mark in shown:
        centre, (low, high) = (mark.x, mark.xerr) if part == "x" else (mark.y, mark.yerr)
        values += [centre, centre - low[0], centre + high[0]]
    if objective["metric"] in RATIO_METRICS and use_log(values):
        log_ticks(ax, part, values)
    else:
        plain_ticks(ax, part)
    role = "forgetting" if part == "x" else "learning"
    what = (
        METRIC_WORDS.get(objective["metric"])
        or f"{objective.get('task', '')} {objective['metric']}"
    )
    split = SPLIT_WORDS.get(objective["split"], objective["split"])
    better = "higher" if objective["higher_is_better"] else "lower"
    label = f"{role}: {what} on {split} languages ({better} is better)"
    (ax.set_xlabel if part == "x" else ax.set_ylabel)(label)


def _label_points(fig, ax, shown: list[Mark]) -> None:
    """Name every shown mark clear of the others and of every interval's ends."""
    ends = [xy for mark in shown for xy in _ends(mark)[1:]]
    bold = [mark.kind == "point" for mark in shown]
    place_labels(fig, ax, [(m.x, m.y) for m in shown], [m.label for m in shown], ends, bold)


def _ends(mark: Mark) -> list[tuple[float, float]]:
    """A mark's centre and the four ends of its interval bars (their caps are markers too)."""
    (left,), (right,) = mark.xerr
    (below,), (above,) = mark.yerr
    x, y = mark.x, mark.y
    return [(x, y), (x - left, y), (x + right, y), (x, y - below), (x, y + above)]


def reference_name(document: dict[str, Any]) -> str:
    """What the changes are read against: TRAINED, or with several experts the Expert Soup."""
    return "Expert Soup" if document.get("experts") else "TRAINED"


def _handles(kinds: set[str], reference: str) -> list:
    """One legend entry per kind of point drawn (TRAINED's named as the reference)."""
    names = {k: reference if k == "trained" else STYLE[k][2] for k in STYLE}
    return [marker_handle(names[k], STYLE[k][0], STYLE[k][1]) for k in STYLE if k in kinds]


def _value_and_error(entry: dict[str, Any]) -> tuple[float, list[list[float]]]:
    """A point's value and, as error bars around it, the 95% paired interval of its change from
    TRAINED (a perplexity's as a ratio; BASE's values often lie orders of magnitude away)."""
    change, value = entry.get("vs_trained") or {}, entry["value"]
    if change.get("delta") is None:
        return value, [[0.0], [0.0]]
    if change.get("ratio"):  # perplexities: the interval of the ratio, around the value
        low = value * change["ratio_low"] / change["ratio"]
        high = value * change["ratio_high"] / change["ratio"]
        return value, [[max(0.0, value - low)], [max(0.0, high - value)]]
    low, high = change["delta"] - change["ci_low"], change["ci_high"] - change["delta"]
    return value, [[max(0.0, low)], [max(0.0, high)]]
