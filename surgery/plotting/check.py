"""The figure check: render a figure and list what a reader could not read.

A figure fails when a text leaves the canvas or overlaps another text, the legend or a marker
it does not label (or a legend covers data); when a colour scale is more than twice as wide as
the data on it; when more than 80% of an axis's points crowd into 10% of its range (in the
axis's own scale: an outlier squashing the rest); or when a title holds an unfilled
`{placeholder}`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

# A text may poke this many pixels past the canvas or into a neighbour (antialiasing, rounding).
SLACK = 1.0
CROWD_SHARE = 0.8  # more than this share of an axis's points...
CROWD_WIDTH = 0.1  # ...within this share of its range: the rest are squashed
MIN_POINTS = 5  # fewer points than this are not "crowded"
MIN_SCALE_USE = 0.5  # the data must cover at least this share of its colour scale
PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_.]*\}")


def figure_problems(fig) -> list[str]:
    """Everything the check finds wrong with `fig`, one line each ([] when it reads well)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = list(_texts(fig))
    boxes = [(text, text.get_window_extent(renderer)) for text in texts]
    problems = _off_canvas(fig, boxes) + _overlaps(boxes) + _placeholders(fig)
    for ax in fig.axes:
        problems += _legend_problems(ax, boxes, renderer)
        problems += _marker_overlaps(ax, boxes, renderer)
        problems += _crowded(ax)
    return problems + _scale_use(fig)


def _name(text) -> str:
    return repr(text.get_text()[:40])


def _visible(text) -> bool:
    return bool(text.get_visible() and text.get_text().strip())


def _ticklabels(axis) -> Iterator:
    """The tick labels drawn: those of ticks inside the axis's view."""
    low, high = sorted(axis.get_view_interval())
    tolerance = (high - low) * 1e-9
    locs = axis.get_majorticklocs()
    for tick, loc in zip(axis.get_major_ticks(len(locs)), locs, strict=False):
        if low - tolerance <= loc <= high + tolerance:
            yield from (tick.label1, tick.label2)


def _texts(fig) -> Iterator:
    """Every visible, non-empty text of the figure, each once."""
    seen: set[int] = set()
    candidates = list(fig.texts)
    if fig._suptitle is not None:
        candidates.append(fig._suptitle)
    for legend in fig.legends:
        candidates += [*legend.get_texts(), legend.get_title()]
    for ax in fig.axes:
        candidates += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        candidates += [ax.xaxis.offsetText, ax.yaxis.offsetText, *ax.texts]
        candidates += [*_ticklabels(ax.xaxis), *_ticklabels(ax.yaxis)]
        legend = ax.get_legend()
        if legend is not None:
            candidates += [*legend.get_texts(), legend.get_title()]
    for text in candidates:
        if id(text) not in seen and _visible(text):
            seen.add(id(text))
            yield text


def _off_canvas(fig, boxes) -> list[str]:
    canvas = fig.bbox
    return [
        f"text {_name(text)} leaves the canvas"
        for text, box in boxes
        if box.x0 < canvas.x0 - SLACK
        or box.y0 < canvas.y0 - SLACK
        or box.x1 > canvas.x1 + SLACK
        or box.y1 > canvas.y1 + SLACK
    ]


def _intersect(a, b) -> bool:
    """Whether two display boxes overlap by more than the slack in both directions."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK and min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK


def _overlaps(boxes) -> list[str]:
    problems = []
    for i, (text, box) in enumerate(boxes):
        for other, other_box in boxes[i + 1 :]:
            if _intersect(box, other_box):
                problems.append(f"text {_name(text)} overlaps text {_name(other)}")
    return problems


def _placeholders(fig) -> list[str]:
    titles = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        titles += [ax.title, ax._left_title, ax._right_title]
    return [
        f"title {_name(title)} holds an unfilled placeholder"
        for title in titles
        if PLACEHOLDER.search(title.get_text())
    ]


def _legend_problems(ax, boxes, renderer) -> list[str]:
    """A text outside the legend inside its frame, or the legend covering a data mark."""
    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return []
    frame = legend.get_window_extent(renderer)
    own = {id(t) for t in [*legend.get_texts(), legend.get_title()]}
    problems = [
        f"text {_name(text)} is covered by the legend"
        for text, box in boxes
        if id(text) not in own and _intersect(box, frame)
    ]
    for mark in _marks(ax, renderer):
        if _intersect(mark, frame):
            problems.append(f"the legend of {_axes_name(ax)} covers data")
            break
    return problems


def _axes_name(ax) -> str:
    return repr(ax.get_title() or ax.get_label() or "an axes")


def _marks(ax, renderer) -> Iterator:
    """Display boxes of the data marks of `ax`: markers of lines and scatters, bars."""
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import Bbox

    inside = ax.get_window_extent(renderer)
    for centre, radius in _marker_centres(ax):
        if inside.x0 <= centre[0] <= inside.x1 and inside.y0 <= centre[1] <= inside.y1:
            yield Bbox.from_extents(
                centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius
            )
    for container in ax.containers:
        for patch in container:
            if isinstance(patch, Rectangle) and patch.get_height():
                yield Bbox.intersection(patch.get_window_extent(renderer), inside) or Bbox.null()


def _marker_centres(ax) -> Iterator[tuple[tuple[float, float], float]]:
    """(display centre, radius in pixels) of every marker drawn in data coordinates."""
    scale = ax.figure.dpi / 72
    for line in ax.get_lines():
        marker = line.get_marker()
        if not line.get_visible() or marker in (None, "", "None", " ", ","):
            continue
        if line.get_transform() != ax.transData:
            continue
        radius = line.get_markersize() * scale / 2
        for point in line.get_xydata():
            if all(math.isfinite(v) for v in point):
                yield tuple(ax.transData.transform(point)), radius
    for collection in ax.collections:
        offsets = collection.get_offsets()
        if not len(offsets) or collection.get_offset_transform() != ax.transData:
            continue
        sizes = collection.get_sizes() if len(collection.get_sizes()) else [36]
        for k, point in enumerate(offsets):
            if all(math.isfinite(v) for v in point):
                radius = math.sqrt(sizes[k % len(sizes)]) * scale / 2
                yield tuple(ax.transData.transform(point)), radius


def _labelled(text, ax, centre) -> bool:
    """Whether `text` is an annotation of the point at display position `centre`."""
    from matplotlib.text import Annotation

    if not isinstance(text, Annotation) or text.xycoords != "data":
        return False
    x, y = ax.transData.transform(text.xy)
    return math.hypot(x - centre[0], y - centre[1]) < 2.0


def _marker_overlaps(ax, boxes, renderer) -> list[str]:
    problems = []
    inside = ax.get_window_extent(renderer)
    centres = [c for c in _marker_centres(ax) if inside.contains(*c[0])]
    for text, box in boxes:
        for centre, radius in centres:
            x, y = centre
            if not (
                box.x0 - radius < x < box.x1 + radius and box.y0 - radius < y < box.y1 + radius
            ):
                continue
            near_x = min(max(x, box.x0), box.x1)
            near_y = min(max(y, box.y0), box.y1)
            if math.hypot(x - near_x, y - near_y) < radius - SLACK and not _labelled(
                text, ax, centre
            ):
                problems.append(f"text {_name(text)} overlaps a marker it does not label")
                break
    return problems


def _axis_points(ax) -> dict[str, list[float]]:
    """The data points of `ax` per axis ("x", "y"): line vertices, scatter offsets, bar tops."""
    points: dict[str, list[float]] = {"x": [], "y": []}
    for line in ax.get_lines():
        if line.get_visible() and line.get_transform() == ax.transData:
            for x, y in line.get_xydata():
                points["x"].append(float(x))
                points["y"].append(float(y))
    for collection in ax.collections:
        if collection.get_offset_transform() == ax.transData:
            for x, y in collection.get_offsets():
                points["x"].append(float(x))
                points["y"].append(float(y))
    for container in ax.containers:
        for patch in getattr(container, "patches", []):
            horizontal = getattr(container, "orientation", "vertical") == "horizontal"
            x0, y0 = patch.get_xy()
            if horizontal:
                points["x"].append(x0 + patch.get_width())
            else:
                points["y"].append(y0 + patch.get_height())
    return points


def _crowded(ax) -> list[str]:
    """Axes where more than `CROWD_SHARE` of the points lie in `CROWD_WIDTH` of the range."""
    problems = []
    for name, values in _axis_points(ax).items():
        log = (ax.get_xscale() if name == "x" else ax.get_yscale()) == "log"
        scaled = sorted(
            math.log10(v) if log else v for v in values if math.isfinite(v) and (v > 0 or not log)
        )
        if len(scaled) < MIN_POINTS or scaled[-1] - scaled[0] <= 0:
            continue
        width = CROWD_WIDTH * (scaled[-1] - scaled[0])
        most, start = 0, 0
        for end, value in enumerate(scaled):
            while value - scaled[start] > width:
                start += 1
            most = max(most, end - start + 1)
        if most > CROWD_SHARE * len(scaled):
            problems.append(
                f"{most} of the {len(scaled)} points on the {name} axis of {_axes_name(ax)} lie "
                f"in {CROWD_WIDTH:.0%} of its range: an outlier squashes the rest"
            )
    return problems


def _scale_use(fig) -> list[str]:
    """Colour scales more than twice as wide as the data drawn on them (the data of every
    panel sharing one scale pooled)."""
    import numpy as np

    pooled: dict[int, tuple[object, str, list]] = {}
    for ax in fig.axes:
        for mappable in [*ax.images, *ax.collections]:
            data = mappable.get_array()
            if data is None or mappable.norm.vmin is None or ax in _colour_bar_axes(fig):
                continue
            values = np.ma.compressed(np.ma.masked_invalid(np.ma.array(data, dtype=float)))
            entry = pooled.setdefault(id(mappable.norm), (mappable.norm, _axes_name(ax), []))
            entry[2].extend(values.tolist())
    problems = []
    for norm, name, values in pooled.values():
        span = norm.vmax - norm.vmin
        if len(values) < 2 or span <= 0:
            continue
        used = (max(values) - min(values)) / span
        if used < MIN_SCALE_USE:
            problems.append(
                f"the data of {name} cover {used:.0%} of its colour scale "
                f"({norm.vmin:g} to {norm.vmax:g})"
            )
    return problems


def _colour_bar_axes(fig) -> list:
    """The axes that hold colour bars (their own image spans the whole scale by design)."""
    return [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]
