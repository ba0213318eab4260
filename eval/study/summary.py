"""The table `surgery eval --suite` prints when it ends: one row per unit, its kind's metric."""

from __future__ import annotations

from typing import Any

from eval.kinds import KINDS
from eval.study.results import SuiteResults, UnitResult


def shown_metric(unit: UnitResult) -> str | None:
    """The metric a unit's row shows: its kind's own (ppl, chrF), else the first score that
    has a standard error (accuracy before its normalised twin), else the first number."""
    kind = KINDS.get(unit.kind)
    numbers = [key for key, value in unit.metrics.items() if _is_score(key, value)]
    if kind is not None and kind.primary in numbers:
        return kind.primary
    with_stderr = [key for key in numbers if f"{key}_stderr" in unit.metrics]
    return (with_stderr or numbers or [None])[0]


def _is_score(key: str, value: Any) -> bool:
    return isinstance(value, float) and not key.endswith("_stderr")


def suite_table(results: SuiteResults) -> str:
    """Every unit of a suite's results as aligned text (as lm-eval prints its table).

    Args:
        results: a results folder's results.json, read.

    Returns:
        One row per unit (its id, split, metric, value, standard error and n), then one row
        per unit left out as missing.
    """
    rows = [("unit", "split", "metric", "value", "stderr", "n")]
    for unit in results.units:
        metric = shown_metric(unit)
        value = unit.metrics.get(metric) if metric else None
        stderr = unit.metrics.get(f"{metric}_stderr")
        rows.append(
            (
                unit.id,
                unit.split or "",
                metric or "",
                "" if value is None else f"{value:.4f}",
                "" if stderr is None else f"{stderr:.4f}",
                str(unit.metrics.get("n", "")),
            )
        )
    for missing in results.missing:
        rows.append((f"{missing.task}/{missing.lang or ''}".rstrip("/"), "", "missing", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(_line(row, widths) for row in rows)


def _line(row: tuple[str, ...], widths: list[int]) -> str:
    left = [cell.ljust(width) for cell, width in zip(row[:3], widths[:3], strict=True)]
    right = [cell.rjust(width) for cell, width in zip(row[3:], widths[3:], strict=True)]
    return "  ".join(left + right).rstrip()
