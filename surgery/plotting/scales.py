"""Colour scales and axes fitted to the data: diverging around 0 for changes of both signs,
one-signed and fitted otherwise; log axes only for ratios spanning more than about 3x."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from surgery.plotting.style import DIVERGING_CMAP, NOISE_COLOUR, SEQUENTIAL_CMAP

# A ratio axis goes log when its largest value is more than this many times its smallest.
LOG_SPAN = 3.0


def finite(values: Iterable[float]) -> list[float]:
    """The values that are numbers (not NaN, not infinite), flattened one level deep."""
    out: list[float] = []
    for value in values:
        if isinstance(value, Sequence | Iterable) and not isinstance(value, str | bytes):
            out += finite(value)
        elif value is not None and math.isfinite(float(value)):
            out.append(float(value))
    return out


def use_log(values: Iterable[float]) -> bool:
    """Whether ratios (perplexities, ratios of scores) go on a log axis: all positive and the
    largest more than `LOG_SPAN` times the smallest. A narrower range reads better linear."""
    numbers = finite(values)
    return bool(numbers) and min(numbers) > 0 and max(numbers) > LOG_SPAN * min(numbers)


@dataclass(frozen=True)
class ColourScale:
    """A colour map with its limits, and whether it is centred on 0 (changes of both signs)."""

    cmap: Any
    vmin: float
    vmax: float
    diverging: bool

    @cached_property
    def norm(self):
        """The matplotlib norm for these limits: one object, so every panel drawn on this scale
        shares it (and the figure check pools their data)."""
        from matplotlib.colors import Normalize

        return Normalize(vmin=self.vmin, vmax=self.vmax)

    def rgba(self, value: float) -> tuple[float, ...]:
        """The colour a cell of `value` gets (the noise grey for NaN)."""
        if not math.isfinite(value):
            from matplotlib.colors import to_rgba

            return to_rgba(NOISE_COLOUR)
        return self.cmap(self.norm(value))


def colour_scale(
    values: Iterable[float], centre: float | None = 0.0, bad: str = NOISE_COLOUR
) -> ColourScale:
    """A colour scale fitted to `values` (NaN ignored; drawn in the noise grey).

    Values on both sides of `centre` get a diverging map centred on it, reaching the largest
    distance from it; values on one side get a sequential map spanning exactly their range (a
    flat range is widened a little so it still has a colour). `centre=None`: always
    sequential. `bad`: the colour of NaN cells (the noise grey; white for a masked diagonal).
    """
    from matplotlib import colormaps

    numbers = finite(values) or [0.0]
    low, high = min(numbers), max(numbers)
    if centre is not None and low < centre < high:
        reach = max(centre - low, high - centre)
        cmap = colormaps[DIVERGING_CMAP].with_extremes(bad=bad)
        return ColourScale(cmap, centre - reach, centre + reach, True)
    if high - low < 1e-12:
        pad = abs(high) * 0.05 or 0.05
        low, high = low - pad, high + pad
    cmap = colormaps[SEQUENTIAL_CMAP].with_extremes(bad=bad)
    return ColourScale(cmap, low, high, False)


def mask_diagonal(matrix: Sequence[Sequence[float]]) -> list[list[float]]:
    """A copy of a square matrix with its diagonal set to NaN: a self-similarity of 1 carries no
    information and would stretch the colour scale away from the values that do."""
    return [
        [float("nan") if r == c else float(value) for c, value in enumerate(row)]
        for r, row in enumerate(matrix)
    ]
