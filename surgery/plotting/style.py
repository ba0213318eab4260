"""The house style: page-width figure sizes, one font scale, the shared colours, plain ticks.

Every figure is drawn at the size it is read at (a page about 17 cm wide), so its text is the
size the reader sees; `save_figure` never rescales it.
"""

from __future__ import annotations

from typing import Any

# A page about 17 cm wide; figures are drawn at full or half of it (inches).
CM = 1 / 2.54
PAGE_WIDTH = 17 * CM
WIDTHS = {"full": PAGE_WIDTH, "half": PAGE_WIDTH / 2, "wide": PAGE_WIDTH}
DPI = 200  # 17 cm at 200 dpi: 1339 px, sharp on screen and in print

# Text in points at that size: 8 pt body, 9 pt titles, 7 pt cell numbers and legends.
FONT = {"body": 8, "title": 9, "small": 7}

# One colour per role, the same in every figure.
NOISE_COLOUR = "#c8c8c8"  # within noise: light grey, and one legend entry saying so
NOISE_LABEL = "within noise"
BASE_COLOUR = "#2ca02c"  # BASE: green
TRAINED_COLOUR = "#222222"  # TRAINED: near black
FRONT_COLOUR = "#1f77b4"  # points on a front, and the front itself
BASELINE_COLOUR = "#ff7f0e"  # baselines a search compares against
OUTLIER_COLOUR = "#555555"  # the arrow and value of a point drawn off the axis
# Series colours, in order (colour-blind safe: Okabe-Ito without black and yellow).
SERIES = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999")
DIVERGING_CMAP = "RdBu"  # changes: red below 0, blue above
SEQUENTIAL_CMAP = "viridis"  # one-signed quantities

RC: dict[str, Any] = {
    "font.size": FONT["body"],
    "axes.titlesize": FONT["title"],
    "axes.labelsize": FONT["body"],
    "xtick.labelsize": FONT["small"],
    "ytick.labelsize": FONT["small"],
    "legend.fontsize": FONT["small"],
    "legend.title_fontsize": FONT["small"],
    "figure.titlesize": FONT["title"],
    "axes.grid": False,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.markersize": 4,
    "lines.linewidth": 1.2,
    "savefig.dpi": DPI,
    "figure.dpi": DPI,
}


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), with the house style set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler

    plt.rcParams.update({**RC, "axes.prop_cycle": cycler(color=SERIES)})
    return plt


def figure(
    width: str | float = "full", height: float = 7.0, nrows: int = 1, ncols: int = 1, **kwargs: Any
):
    """A figure of the house style and its axes (a 2-D array, always): `width` one of `WIDTHS`
    or centimetres, `height` in centimetres; constrained layout, so no text leaves the canvas.

    Returns:
        (figure, axes).
    """
    plt = pyplot()
    inches = WIDTHS[width] if isinstance(width, str) else width * CM
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=(inches, height * CM), squeeze=False, **kwargs)


def close(fig) -> None:
    """Free a figure's memory (pyplot keeps every figure until closed)."""
    pyplot().close(fig)


def plain_number(value: float) -> str:
    """A tick or cell number as people write it: 4.7, 12, 1,000; never 1e+03 or an offset."""
    if value != 0 and abs(value) < 0.01:
        return f"{value:.1e}".replace("e-0", "e-")
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def plain_ticks(ax, axis: str = "y") -> None:
    """Tick labels as plain numbers on `axis` ("x", "y" or "both"): never an offset
    (`+2.186`) or a power of ten (`1.955x10^0`); a log axis labels its major ticks only (1, 2
    and 5 of each decade when it spans few decades). Call it after the limits are set."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for name in ("x", "y") if axis == "both" else (axis,):
        target = ax.xaxis if name == "x" else ax.yaxis
        low, high = sorted(target.get_view_interval())
        if target.get_scale() == "log" and low > 0 and high / low < 300:
            # Under two and a half decades: 1, 2 and 5 of each decade, or too few ticks to read.
            target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        target.set_major_formatter(FuncFormatter(lambda value, _pos: plain_number(value)))
        target.set_minor_formatter(NullFormatter())


def text_colour_on(rgba: tuple[float, ...]) -> str:
    """Black or white, whichever reads on a background of colour `rgba` (by its luminance)."""
    red, green, blue = rgba[:3]
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    return "black" if luminance > 0.45 else "white"
