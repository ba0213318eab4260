"""Marks shared by every figure: the within-noise legend entry, outliers drawn as arrows at the
axis edge, step-drawn Pareto fronts and numbered quoted points."""

from __future__ import annotations

import math
from collections.abc import Sequence

from surgery.plotting.scales import LOG_SPAN
from surgery.plotting.style import (
    FONT,
    FRONT_COLOUR,
    NOISE_COLOUR,
    NOISE_LABEL,
    OUTLIER_COLOUR,
    plain_number,
)

# An outlier is a value this many times (log axis) or ranges (linear) beyond the rest.
OUTLIER_FACTOR = 10.0
# A front is drawn only through this many points or more: two points are not a front.
MIN_FRONT = 3


def noise_handle(hatch: bool = False, of: str | None = None):
    """The one legend entry for "within noise": a grey patch (hatched where cells are);
    `of`: whose noise, when the figure has one reference ("within noise of trained")."""
    from matplotlib.patches import Patch

    label = f"{NOISE_LABEL} of {of}" if of else NOISE_LABEL
    return Patch(facecolor=NOISE_COLOUR, hatch="///" if hatch else None, label=label)


def split_outliers(values: Sequence[float], log: bool) -> tuple[list[int], list[int]]:
    """Indices of the values kept on the axis and of the outliers: values more than
    `OUTLIER_FACTOR` times the kept values' span (in the axis's scale: decades for a log axis)
    away from the median. Needs 3 values or more; otherwise all are kept."""
    if len(values) < 3:
        return list(range(len(values))), []
    scaled = [math.log10(v) if log and v > 0 else v for v in values]
    order = sorted(scaled)
    median = order[len(order) // 2]
    # The span of the middle values: a quarter of the sorted list either side of the median.
    quarter = max(1, len(order) // 4)
    span = max(order[-1 - quarter] - order[quarter], 1e-12)
    if log:
        span = max(span, math.log10(LOG_SPAN) / 2)
    far = [i for i, v in enumerate(scaled) if abs(v - median) > OUTLIER_FACTOR * span]
    return [i for i in range(len(values)) if i not in far], far


def outlier_arrow(ax, axis: str, value: float, at: float, label: str) -> None:
    """Mark a point lying off `axis` ("x" or "y") at `value`: an arrow at that axis's edge,
    at position `at` on the other axis, with `label` and the value written next to it. Call it
    after the data are drawn: it widens the other axis to show `at` if needed."""
    _include(ax, "x" if axis == "y" else "y", at)
    high = value > sum(ax.get_ylim() if axis == "y" else ax.get_xlim()) / 2
    text = f"{label} {plain_number(value)}"
    style = {"color": OUTLIER_COLOUR, "fontsize": FONT["small"]}
    arrow = {"arrowstyle": "->", "color": OUTLIER_COLOUR, "lw": 1}
    if axis == "y":
        edge = 1.0 if high else 0.0
        xy, xytext = (at, edge), (at, edge - 0.12 if high else edge + 0.12)
        transform = ax.get_xaxis_transform()
        ha, va = "center", "top" if high else "bottom"
    else:
        edge = 1.0 if high else 0.0
        xy, xytext = (edge, at), (edge - 0.12 if high else edge + 0.12, at)
        transform = ax.get_yaxis_transform()
        ha, va = "right" if high else "left", "center"
    ax.annotate(
        text,
        xy=xy,
        xytext=xytext,
        xycoords=transform,
        textcoords=transform,
        arrowprops=arrow,
        ha=ha,
        va=va,
        annotation_clip=False,
        **style,
    )


def _include(ax, axis: str, at: float) -> None:
    """Widen `axis`'s limits, if needed, so `at` lies inside with a 5% margin."""
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    if low <= at <= high:
        return
    pad = 0.05 * (max(high, at) - min(low, at))
    limits = (min(low, at - pad), max(high, at + pad))
    (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)


def pareto_steps(
    ax,
    xs: Sequence[float],
    ys: Sequence[float],
    higher_y_better: bool,
    label: str = "front",
    higher_x_better: bool = False,
) -> bool:
    """Draw the front of points (x: lower is better unless `higher_x_better`; y: higher or
    lower is better) as steps, as fronts are: between two points nothing in between is
    attainable. Only with `MIN_FRONT` points or more.

    Returns:
        whether a front was drawn.
    """
    if len(xs) < MIN_FRONT:
        return False
    points = sorted(zip(xs, ys, strict=True))
    ax.step(
        [x for x, _ in points],
        [y for _, y in points],
        # Between two points, the y of the one better on x holds only from its own x on.
        where="pre" if higher_x_better else "post",
        color=FRONT_COLOUR,
        lw=1,
        alpha=0.7,
        label=label,
        zorder=1,
    )
    return True


def number_points(
    ax, points: Sequence[tuple[float, float]], labels: Sequence[str], offset=(5, 5)
) -> None:
    """Write a label (a point's number as the text quotes it) next to each point, as an
    annotation that names the point it labels (the figure check exempts that point)."""
    for (x, y), label in zip(points, labels, strict=True):
        ax.annotate(
            label,
            xy=(x, y),
            xytext=offset,
            textcoords="offset points",
            fontsize=FONT["small"],
            fontweight="bold",
        )
