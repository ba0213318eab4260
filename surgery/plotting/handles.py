"""Legend entries, cell texts and tick labels for figures drawn outside this package (eval's,
the demo's), so that they need no matplotlib import and no font size of their own."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from surgery.plotting.style import FONT


def patch_handle(label: str, colour="none", hatch: str | None = None, edge="none"):
    """A legend entry drawn as a patch: a colour, a hatching, or (the defaults) words only."""
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor=edge, hatch=hatch, label=label)


def marker_handle(label: str, marker: str, colour):
    """A legend entry drawn as a marker (a kind of point)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], marker=marker, color=colour, linestyle="", label=label)


def cell_text(ax, col: int, row: int, text: str, colour="black", blank: bool = False) -> None:
    """Write `text` in the middle of heatmap cell (`col`, `row`) in the cell-number size;
    `blank`: on a white cell first (nothing measured there)."""
    if blank:
        from matplotlib.patches import Rectangle

        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, color="white", zorder=2))
    ax.text(
        col, row, text, ha="center", va="center", color=colour, zorder=3, fontsize=FONT["small"]
    )


# Label offsets (points) tried in turn until a label overlaps nothing drawn before it.
OFFSETS = (
    *((dx, dy) for dx in (5, -14) for dy in (4, -11)),
    *((dx, dy) for dx in (8, -18) for dy in (12, -19)),
    *((dx, dy) for dx in (16, -26) for dy in (20, -27)),
    *((dx, dy) for dx in (24, -34, 0) for dy in (30, -37)),
    *((dx, dy) for dx in (40, -50, 0) for dy in (44, -51)),
)
MARK_RADIUS = 10  # pixels a label keeps from a marker's centre


def place_labels(
    fig,
    ax,
    points: Sequence[tuple[float, float]],
    labels: Sequence[str],
    avoid: Sequence[tuple[float, float]] = (),
    bold: Sequence[bool] = (),
) -> None:
    """Name each point (data coordinates) at the first offset where its label overlaps no
    label placed before it and no other point or `avoid` point (interval ends: their caps are
    markers too); where none is free, at the one with fewest overlaps. Past the first ring of
    offsets a thin line says which point a label names. Call it last: it reads the layout."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    taken = [tuple(ax.transData.transform(xy)) for xy in [*points, *avoid]]
    boxes: list = []

    def crowd(k: int) -> float:
        """How close the nearest other point is (pixels): the most crowded are named first."""
        here = taken[k]
        return min((math.dist(here, p) for i, p in enumerate(taken) if i != k), default=0.0)

    for k in sorted(range(len(points)), key=crowd):
        xy, label = points[k], labels[k]
        centre = taken[k]
        others = [p for p in taken if p != centre]
        heavy = bool(bold) and bold[k]
        best = None
        for offset in OFFSETS:
            text = _point_label(ax, xy, label, offset, heavy)
            box = text.get_window_extent(renderer).expanded(1.05, 1.1)
            text.remove()
            # A label on a label reads worse than one on a marker.
            clashes = 10 * sum(box.overlaps(b) for b in boxes)
            clashes += sum(_near(box, p, MARK_RADIUS) for p in others)
            if best is None or clashes < best[0]:
                best = (clashes, offset, box)
            if not clashes:
                break
        _point_label(ax, xy, label, best[1], heavy)
        boxes.append(best[2])


def _point_label(ax, xy, text: str, offset: Sequence[float], bold: bool):
    line = abs(offset[1]) > 11
    arrow = {"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if line else None
    return ax.annotate(text, xy, xytext=tuple(offset), textcoords="offset points",
                       fontsize=FONT["small"], arrowprops=arrow,
                       fontweight="bold" if bold else "normal")  # fmt: skip


def _near(box, point, radius: float) -> bool:
    """Whether a marker of `radius` pixels at `point` touches `box`."""
    x = min(max(point[0], box.x0), box.x1)
    y = min(max(point[1], box.y0), box.y1)
    return (x - point[0]) ** 2 + (y - point[1]) ** 2 < radius**2


def tick_format(axis, write: Callable[[float], str]) -> None:
    """Label `axis`'s (an x or y axis, a colour bar's included) major ticks with `write`."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _pos: write(value)))
