"""The comparison's outputs: report.md (tables a reader scans first), a long-format CSV, JSON
and the plots, written into a staging folder that becomes REPORT_DIR only when all are done."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from eval.study.compare import WEIGHTING, Comparison
from eval.study.formatting import SPLITS, axis_label, decimals, format_cell, matches
from eval.study.stats import TIE

COLUMNS = (
    "model", "task", "variant", "metric", "scope", "family", "split", "lang", "n", "seeds",
    "value", "seed_std", "delta", "ci_low", "ci_high", "significant",
)  # fmt: skip


def _sign_cell(comparison: Comparison, axis, model, split, over) -> str:
    for test in comparison.sign_tests:
        if matches(test, axis, model=model, split=split, over=over):
            return f"{test['wins']}–{test['losses']}, p={test['p']:.3g}"
    return ""


def _axis_table(comparison: Comparison, axis: dict[str, Any]) -> list[str]:
    digits = decimals(axis)
    columns: list[tuple[str, dict[str, Any]]] = [
        (f"all {short}", {"scope": "overall", "split": split}) for split, short in SPLITS.items()
    ]
    for family in comparison.families:
        for split, short in SPLITS.items():
            where = {"scope": "family", "family": family, "split": split}
            columns.append((f"{family} {short}", where))
    present = [
        (name, where)
        for name, where in columns
        if any(matches(r, axis, **where) for r in comparison.rows)
    ]
    splits = [s for s in SPLITS if any(w.get("split") == s for _, w in present)]
    tests = [(s, over) for over in ("languages", "families") for s in splits]
    header = [name for name, _ in present] + [f"{over} {SPLITS[s]}" for s, over in tests]
    lines = ["| strategy | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for model in comparison.models:
        cells = []
        for _, where in present:
            row = next((r for r in comparison.rows if matches(r, axis, model=model, **where)), None)
            cells.append(format_cell(row, digits) if row else "")
        cells += [_sign_cell(comparison, axis, model, s, over) for s, over in tests]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    better = "higher" if axis["higher_is_better"] else "lower"
    unit = " (%)" if axis["scale"] == "percent" else ""
    return [f"## {axis_label(axis)}{unit}, {better} is better", "", *lines, ""]


def _language_table(comparison: Comparison, axis: dict[str, Any]) -> list[str]:
    digits = decimals(axis)
    rows = [r for r in comparison.rows if matches(r, axis, scope="language")]
    langs = list(dict.fromkeys((r["family"], r["split"], r["lang"], r["n"]) for r in rows))
    lines = [
        "| family | split | language | n | " + " | ".join(comparison.models) + " |",
        "|---" * (len(comparison.models) + 4) + "|",
    ]
    for family, split, lang, n in langs:
        cells = [
            format_cell(next(r for r in rows if r["lang"] == lang and r["model"] == m), digits)
            for m in comparison.models
        ]
        lines.append(
            # A language of the suite's `others` has neither family nor split.
            f"| {family or ''} | {SPLITS.get(split, split or '')} | {lang} | {n} | "
            + " | ".join(cells)
            + " |"
        )
    return [f"### {axis_label(axis)}", "", *lines, ""]


def _task_table(comparison: Comparison, axes: list[dict[str, Any]]) -> list[str]:
    header = [axis_label(a) for a in axes]
    lines = ["| strategy | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for model in comparison.models:
        cells = []
        for axis in axes:
            row = next(r for r in comparison.rows if matches(r, axis, model=model, scope="task"))
            cells.append(format_cell(row, decimals(axis)))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return ["## Tasks without languages", "", *lines, ""]


def report_markdown(comparison: Comparison, plots: list[str]) -> str:
    """report.md: how to read it, one table per primary metric, per-language tables."""
    strategies = ", ".join(f"`{m}`" for m in comparison.models[1:])
    primary = [a for a in comparison.axes if a["primary"]]
    by_language = [
        a for a in primary if any(matches(r, a, scope="language") for r in comparison.rows)
    ]
    tasks = [a for a in primary if a not in by_language]
    lines = [
        f"# Strategies against `{comparison.base}`",
        "",
        f"Strategies {strategies}, scored on the same items as the base (matched by doc id and "
        "prompt hash). Cells: value (change from the base [95% interval]). Intervals: paired "
        f"bootstrap, B = {comparison.resamples} resamples of each language's items with seed "
        f"{comparison.seed}, the same resamples for every model, percentiles 2.5 and 97.5; "
        "family and overall intervals recompute their means on every resample of all their "
        "languages. **Bold**: the interval excludes 0. Sign tests (last columns): wins–losses "
        f"against the base over languages or over families, ties within {TIE:g} dropped, exact "
        "two-sided binomial p.",
        "",
        "How each number is weighted:",
        "",
        *(f"- {scope}: {text}" for scope, text in WEIGHTING.items()),
        "",
    ]
    for name in plots:
        lines += [f"![{name}]({name})", ""]
    for axis in by_language:
        lines += _axis_table(comparison, axis)
    if tasks:
        lines += _task_table(comparison, tasks)
    if by_language:
        lines += ["## Per language", ""]
        for axis in by_language:
            lines += _language_table(comparison, axis)
    others = [axis_label(a) for a in comparison.axes if not a["primary"]]
    if others:
        lines += [f"Also in comparison.csv and comparison.json: {', '.join(others)}.", ""]
    if comparison.skipped:
        lines += [f"Not compared (no per-item outcome): {', '.join(comparison.skipped)}.", ""]
    for reason in comparison.refused:
        lines += [reason, ""]
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """JSON without NaN or infinities: a non-finite float becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """Everything in the comparison as one JSON-ready object."""
    return _finite(
        {
            "format": "surgery-compare/1",
            "base": comparison.base,
            "models": comparison.models,
            "folders": comparison.folders,
            "bootstrap": {
                "resamples": comparison.resamples,
                "seed": comparison.seed,
                "interval": "paired bootstrap percentile 2.5/97.5",
            },
            "weighting": WEIGHTING,
            "axes": comparison.axes,
            "rows": comparison.rows,
            "sign_tests": comparison.sign_tests,
            "skipped": comparison.skipped,
            "refused": comparison.refused,
        }
    )


def write_report(comparison: Comparison, folder: Path) -> None:
    """Write report.md, comparison.csv, comparison.json and the PNG plots into `folder`."""
    from eval.study.plots import plot_heatmap, plot_tradeoff

    plots = [
        name
        for name in (plot_heatmap(comparison, folder), plot_tradeoff(comparison, folder))
        if name
    ]
    (folder / "report.md").write_text(report_markdown(comparison, plots), encoding="utf-8")
    with (folder / "comparison.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in _finite(comparison.rows):
            writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})
    text = json.dumps(comparison_json(comparison), indent=1, sort_keys=True, allow_nan=False)
    (folder / "comparison.json").write_text(text + "\n", encoding="utf-8")
