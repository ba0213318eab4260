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
    image = ax.imshow(grid, cmap=scale.cmap, norm=scale.norm, aspect="auto")
    ax.set_xticks(range(len(cols)), labels=list(cols))
    ax.set_yticks(range(len(rows)), labels=list(rows))
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    write = cell_text or cell_format(values)
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


def cell_format(values: Sequence[Sequence[float]]) -> Callable[[float], str]:
    """One number format for every cell of a heatmap: as many decimals (up to 3) as give its
    smallest non-zero value two significant digits (0.11 and 0.42; -0.025 and 0.370); blank
    for NaN."""
    small = [abs(float(v)) for row in values for v in row if math.isfinite(float(v)) and v]
    if not small or min(small) >= 100:
        return lambda value: "" if math.isnan(value) else plain_number(value)
    decimals = min(3, max(0, 1 - math.floor(math.log10(min(small)))))
    return lambda value: "" if math.isnan(value) else f"{value:.{decimals}f}"


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
    """One legend for the whole figure, below its axes, so it never covers data; as many
    entries a row as the figure's width holds (`ncol` to choose)."""
    if ncol is None:
        longest = max(len(handle.get_label()) for handle in handles)
        entry = longest * FONT["small"] * 0.5 / 72 + 0.4  # inches: text plus the key
        ncol = max(1, min(len(handles), int(fig.get_figwidth() * 0.95 // entry)))
    return fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False)
