"""Legend entries, cell texts and tick labels for figures drawn outside this package (eval's,
the demo's), so that they need no matplotlib import and no font size of their own."""

from __future__ import annotations

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


def point_label(ax, xy: tuple[float, float], text: str, offset: Sequence[float], line: bool,
                bold: bool = False):  # fmt: skip
    """An annotation naming the point at `xy`, `offset` points away (a thin leader line when
    `line`), in the small size; returns it (to measure, or remove)."""
    arrow = {"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if line else None
    return ax.annotate(text, xy, xytext=tuple(offset), textcoords="offset points",
                       fontsize=FONT["small"], arrowprops=arrow,
                       fontweight="bold" if bold else "normal")  # fmt: skip


def tick_format(axis, write: Callable[[float], str]) -> None:
    """Label `axis`'s (an x or y axis, a colour bar's included) major ticks with `write`."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _pos: write(value)))
