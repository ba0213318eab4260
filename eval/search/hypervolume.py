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


def nondominated(points: Sequence[Sequence[float]], higher: Sequence[bool]) -> list[int]:
    """The indices of the points no other point dominates (of equal points, the first)."""

    def gains(point: Sequence[float]) -> list[float]:
        return [v if up else -v for v, up in zip(point, higher, strict=True)]

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and a != b

    oriented = [gains(p) for p in points]
    return [
        i
        for i, a in enumerate(oriented)
        if not any(dominates(b, a) for b in oriented) and a not in oriented[:i]
    ]


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


def section(
    objectives: Sequence[dict],
    search_inputs: Sequence[Sequence[float]],
    trials: Sequence[Sequence[float] | None],
    report_inputs: Sequence[Sequence[float]],
    frontier: Sequence[Sequence[float]],
) -> dict:
    """frontier.json's `hypervolume`: the search half's after each trial and the report
    half's of the final frontier, each against its own half's reference point.

    Args:
        objectives: the optimized objectives, as frontier.json lists them.
        search_inputs: BASE's and each input model's values on the search half.
        trials: each finished trial's values in number order (None: outside the budgets).
        report_inputs: BASE's and each input model's values on the report half.
        frontier: the frontier points' values on the report half.
    """
    higher = [o["higher_is_better"] for o in objectives]
    metrics = [o["metric"] for o in objectives]
    names = [o["name"] for o in objectives]
    search = Frame.of(higher, metrics, search_inputs)
    report = Frame.of(higher, metrics, report_inputs)
    return {
        "logarithm": [name for name, log in zip(names, search.log, strict=True) if log],
        "search": {
            "reference": dict(zip(names, search.reference, strict=True)),
            "per_trial": search.curve(trials),
        },
        "report": {
            "reference": dict(zip(names, report.reference, strict=True)),
            "frontier": report.volume(frontier),
        },
    }


def markdown_lines(entry: dict) -> list[str]:
    """report.md's hypervolume section: the reference points, the report half's value, and
    the search half's after every tenth of the trials."""
    curve = entry["search"]["per_trial"]
    stride = max(1, len(curve) // 10)
    marks = sorted({*range(stride, len(curve) + 1, stride), len(curve)}) if curve else []

    def point(reference: dict) -> str:
        return ", ".join(f"{name} {value:.4g}" for name, value in reference.items())

    logs = entry["logarithm"]
    lines = [
        "## Hypervolume",
        "",
        "The volume of the objectives' space the frontier dominates, up to a reference point: "
        "on each objective, the worst value of BASE and every input model on that half "
        f"(search half: {point(entry['search']['reference'])}; report half: "
        f"{point(entry['report']['reference'])})"
        + (f"; {', '.join(logs)} as logarithms" if logs else "")
        + ".",
        "",
        f"Report half, final frontier: {entry['report']['frontier']:.4g}.",
        "",
        "| trials | " + " | ".join(str(m) for m in marks) + " |",
        "|---|" + "---|" * len(marks),
        "| search half | " + " | ".join(f"{curve[m - 1]:.4g}" for m in marks) + " |",
        "",
    ]
    return lines
