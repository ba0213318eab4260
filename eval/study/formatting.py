"""Labels, digits and cells shared by the comparison's report and plots."""

from __future__ import annotations

import re
from typing import Any

SPLITS = {"held_in": "in", "held_out": "out"}
# Columns of the headline tables and heatmap: the macros per split, then the suite's `others`.
OVERALL = {"held_in": "in", "held_out": "out", "others": "others"}
ADJUSTED = "†"  # the change survives Benjamini-Hochberg over its table
FEW = "‡"  # the cell rests on fewer than MIN_ITEMS items in some language: never bold
# The variant of a task's axis (and output rows) averaged or pooled over its directions (FLORES:
# into and out of English), beside one per direction.
ALL_DIRECTIONS = "all directions"


def variant_label(variant: str) -> str:
    """A variant template as words: `eng_Latn-{lang}` -> `eng_Latn→each language`."""
    text = re.sub(r"\{lang\}", "each language", variant)
    text = re.sub(r"\{(\w+)\}", r"\1", text)
    return text.replace("-", "→") if variant.count("-") == 1 else text


def axis_label(axis: dict[str, Any]) -> str:
    """`task`, or `task variant`, then the metric unless it is the task's name:
    `flores eng_Latn→each language · chrf`, `ppl` (no raw `{lang}` placeholder)."""
    variant = axis["variant"]
    task = axis["task"] if variant is None else f"{axis['task']} {variant_label(variant)}"
    return task if axis["metric"] == task else f"{task} · {axis['metric']}"


def decimals(axis: dict[str, Any]) -> int:
    """Digits shown: one for percentages and chrF, three for bits per byte, else two."""
    if axis["scale"] == "percent" or axis["metric"].startswith("chrf"):
        return 1
    return 3 if axis["metric"] == "bits_per_byte" else 2


def format_cell(row: dict[str, Any], digits: int, bold: str = "significant") -> str:
    """`61.2 (+1.7 [0.4, 3.0])`, bold where `row[bold]` (by default `significant`: the
    unadjusted interval excludes 0) and the row rests on enough items; the base: the value.

    With several few-shot seeds the value carries their population std: `61.2±0.4 (...)`.
    `†` marks a change that survives Benjamini-Hochberg over its table, `‡` a cell resting on
    too few items (never bold).
    """
    text = f"{row['value']:.{digits}f}"
    if row["seed_std"] is not None:
        text += f"±{row['seed_std']:.{digits}f}"
    if row["delta"] is None:
        return text
    text += (
        f" ({row['delta']:+.{digits}f} [{row['ci_low']:.{digits}f}, {row['ci_high']:.{digits}f}])"
    )
    return _marked(text, row, bold)


def _marked(text: str, row: dict[str, Any], bold: str) -> str:
    """Bold where `row[bold]` unless the row rests on too few items, then `†` (survives
    Benjamini-Hochberg) and `‡` (few items)."""
    text = f"**{text}**" if row.get(bold) and not row.get("few_items") else text
    if row.get("significant_adjusted"):
        text += ADJUSTED
    return text + FEW if row.get("few_items") else text


def format_change(row: dict[str, Any], digits: int, bold: str = "significant") -> str:
    """A change alone: `+1.7 [0.4, 3.0]`, a perplexity's with its ratio to the base
    (`+18.64 [17.24, 20.04] ×1.07`); bold and marked as `format_cell`."""
    text = f"{row['delta']:+.{digits}f} [{row['ci_low']:.{digits}f}, {row['ci_high']:.{digits}f}]"
    if row.get("ratio") is not None:
        text += f" ×{row['ratio']:#.3g}"
    return _marked(text, row, bold)


def matches(row: dict[str, Any], axis: dict[str, Any], **where: Any) -> bool:
    keys = ("task", "variant", "metric")
    return all(row[k] == axis[k] for k in keys) and all(row[k] == v for k, v in where.items())


def find_row(rows: list[dict[str, Any]], axis: dict[str, Any], **where: Any) -> dict | None:
    """The first row of `axis` whose fields equal `where`, or None."""
    return next((row for row in rows if matches(row, axis, **where)), None)
