"""Log axes that label enough ticks to read a value off them."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Steps per decade by the decades the view spans: within one, 1-2-5 would leave one or two
# labels; over several, they would run into each other.
ONE_DECADE = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
TWO_DECADES = (1.0, 2.0, 5.0)
MANY_DECADES = (1.0,)


def log_ticks(ax, axis: str, values: Sequence[float]) -> None:
    """Put `axis` ("x" or "y") of `ax` on a log scale whose major ticks fall at 1, 2 and 5 of
    each decade (1, 1.5, 2, 3, 5 and 7 where the view spans a decade or less; only 1 past 2.5
    decades, counted over the positive `values` the axis shows), labelled as plain numbers."""
    from matplotlib.ticker import LogLocator

    from surgery.plotting.style import plain_ticks

    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    positive = [v for v in values if v > 0]
    decades = math.log10(max(positive) / min(positive))
    subs = ONE_DECADE if decades <= 1 else TWO_DECADES if decades <= 2.5 else MANY_DECADES
    plain_ticks(ax, axis)  # its formatter; its locator is replaced just below
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(LogLocator(subs=subs))
