"""The hypervolume of a frontier: how much of the objectives' space it dominates.

Each objective is turned into a gain over the reference point (the reference minus the value
where lower is better, the value minus the reference where higher is better), so the region a
frontier dominates is the union of boxes from the origin to each point's gains. A point no
better than the reference on some objective adds nothing. Perplexities enter as their
logarithm: a perplexity's change is a ratio (the report's axes are logarithmic too), and
BASE's perplexity on languages it never saw lies orders of magnitude above every trained
point's, which would otherwise drown the other objective.

The volume is exact: the objectives are sliced at each point's last gain, and each slice's
volume is the hypervolume of the points that reach it, one objective fewer, down to a sweep in
two objectives (O(n log n) there, O(n^2 log n) in three). optuna's own hypervolume is private.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Metrics that enter as their logarithm (perplexities; bits per byte already is one).
LOG_METRICS = ("ppl", "word_perplexity", "byte_perplexity")


def hypervolume(
    points: Sequence[Sequence[float]], reference: Sequence[float], higher: Sequence[bool]
) -> float:
    """The exact volume that `points` dominate, bounded by `reference`.

    Args:
        points: one value per objective each.
        reference: the bound on each objective (a point must be better to count).
        higher: per objective, whether a higher value is better.
    """
    gains = [
        [v - r if up else r - v for v, r, up in zip(point, reference, higher, strict=True)]
        for point in points
    ]
    return _volume([g for g in gains if all(x > 0 for x in g)], len(reference))


def _volume(gains: list[list[float]], dims: int) -> float:
    """The volume of the union of boxes [0, g] (every gain positive)."""
    if not gains:
        return 0.0
    if dims == 1:
        return max(g[0] for g in gains)
    if dims == 2:
        area, reached = 0.0, 0.0
        # Widest first: each point adds the strip of its width above the height reached so far.
        for x, y in sorted(gains, key=lambda g: -g[0]):
            if y > reached:
                area, reached = area + x * (y - reached), y
        return area
    levels = sorted({g[-1] for g in gains}, reverse=True)
    volume = 0.0
    for level, below in zip(levels, [*levels[1:], 0.0], strict=True):
        reaching = [g[:-1] for g in gains if g[-1] >= level]
        volume += _volume(reaching, dims - 1) * (level - below)
    return volume


@dataclass(frozen=True)
class Frame:
    """How a search's objectives enter its hypervolume: their directions, which are
    perplexities (taken as logarithms), and the reference point in the objectives' own units."""

    higher: tuple[bool, ...]
    log: tuple[bool, ...]
    reference: tuple[float, ...]

    @classmethod
    def of(
        cls, higher: Sequence[bool], metrics: Sequence[str], inputs: Sequence[Sequence[float]]
    ) -> Frame:
        """The frame whose reference is, on each objective, the worst value among `inputs`
        (BASE's and every input model's values)."""
        worst = [
            (min if up else max)(values[i] for values in inputs) for i, up in enumerate(higher)
        ]
        log = tuple(metric in LOG_METRICS for metric in metrics)
        return cls(tuple(higher), log, tuple(worst))

    def _scaled(self, values: Sequence[float]) -> list[float]:
        return [math.log(v) if log else v for v, log in zip(values, self.log, strict=True)]

    def volume(self, points: Sequence[Sequence[float]]) -> float:
        """The hypervolume of `points` (the objectives' values) in this frame."""
        return hypervolume(
            [self._scaled(p) for p in points], self._scaled(self.reference), self.higher
        )

    def curve(self, points: Sequence[Sequence[float] | None]) -> list[float]:
        """The hypervolume after each point in turn (None: a trial outside the budgets, which
        adds nothing)."""
        seen: list[Sequence[float]] = []
        volumes = []
        for point in points:
            if point is not None:
                seen.append(point)
            volumes.append(self.volume(seen))
        return volumes
