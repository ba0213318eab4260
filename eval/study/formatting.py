"""Labels, digits and cells shared by the comparison's report and plots."""

from __future__ import annotations

from typing import Any

SPLITS = {"held_in": "in", "held_out": "out"}


def axis_label(axis: dict[str, Any]) -> str:
    """`task`, or `task variant`, then the metric unless it is the task's name:
    `flores eng_Latn-{lang} · chrf`, `ppl`."""
    task = axis["task"] if axis["variant"] is None else f"{axis['task']} {axis['variant']}"
    return task if axis["metric"] == task else f"{task} · {axis['metric']}"


def decimals(axis: dict[str, Any]) -> int:
    """Digits shown: one for percentages and chrF, three for bits per byte, else two."""
    if axis["scale"] == "percent" or axis["metric"].startswith("chrf"):
        return 1
    return 3 if axis["metric"] == "bits_per_byte" else 2


def format_cell(row: dict[str, Any], digits: int) -> str:
    """`61.2 (+1.7 [0.4, 3.0])`, bold where the interval excludes 0; the base: the value only.

    With several few-shot seeds the value carries their population std: `61.2±0.4 (...)`.
    """
    text = f"{row['value']:.{digits}f}"
    if row["seed_std"] is not None:
        text += f"±{row['seed_std']:.{digits}f}"
    if row["delta"] is None:
        return text
    text += (
        f" ({row['delta']:+.{digits}f} [{row['ci_low']:.{digits}f}, {row['ci_high']:.{digits}f}])"
    )
    return f"**{text}**" if row["significant"] else text


def matches(row: dict[str, Any], axis: dict[str, Any], **where: Any) -> bool:
    keys = ("task", "variant", "metric")
    return all(row[k] == axis[k] for k in keys) and all(row[k] == v for k, v in where.items())


def find_row(rows: list[dict[str, Any]], axis: dict[str, Any], **where: Any) -> dict | None:
    """The first row of `axis` whose fields equal `where`, or None."""
    return next((row for row in rows if matches(row, axis, **where)), None)
