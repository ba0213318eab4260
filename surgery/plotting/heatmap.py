"""A labelled heatmap on a fitted colour scale, every cell's value written in a colour that
reads on it, and its colour bar; legends kept off the data."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from surgery.plotting.scales import ColourScale
from surgery.plotting.style import FONT, plain_number, text_colour_on


def heatmap(
    ax,
    values: Sequence[Sequence[float]],
    rows: Sequence[str],
    cols: Sequence[str],
    scale: ColourScale,
    cell_text: Callable[[float], str] | None = None,
    hatch_nan: bool = False,
):
    """Draw `values` (rows x cols; NaN cells in the scale's `bad` colour) on `ax` with the row
    and column labels, each cell's text (`cell_text(value)`, default the plain number; ""
    leaves a cell blank) in black or white by the cell's colour. `hatch_nan`: hatch the NaN
    cells too (within noise), so they read without colour.

    Returns:
        the image, for a colour bar.
    """
    import numpy as np

    grid = np.ma.masked_invalid(np.array(values, dtype=float))
    image = ax.imshow(grid, cmap=scale.cmap, norm=scale.norm(), aspect="auto")
    ax.set_xticks(range(len(cols)), labels=list(cols))
    ax.set_yticks(range(len(rows)), labels=list(rows))
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    write = cell_text or (lambda value: "" if math.isnan(value) else plain_number(value))
    for r, row in enumerate(values):
        for c, value in enumerate(row):
            value = float(value)
            if hatch_nan and math.isnan(value):
                ax.add_patch(_hatched_cell(c, r))
            text = write(value)
            if text:
                colour = text_colour_on(scale.rgba(value))
                ax.text(c, r, text, ha="center", va="center", color=colour, fontsize=FONT["small"])
    return image


def _hatched_cell(col: int, row: int):
    from matplotlib.patches import Rectangle

    return Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, hatch="///", edgecolor="white", lw=0)


def colour_bar(fig, image, axes, label: str):
    """A colour bar for `image` beside `axes` (one or a list), labelled; its ends are the
    fitted scale's (no arrows: nothing lies beyond them)."""
    bar = fig.colorbar(image, ax=axes, label=label, shrink=0.9, pad=0.02)
    bar.ax.tick_params(labelsize=FONT["small"])
    return bar


def legend_below(fig, handles, ncol: int | None = None):
    """One legend for the whole figure, below its axes, so it never covers data."""
    return fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=ncol or min(4, len(handles)),
        frameon=False,
    )
