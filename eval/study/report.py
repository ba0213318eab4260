"""The comparison's outputs: report.md (tables a reader scans first), a long-format CSV, JSON
and the plots, written into a staging folder that becomes REPORT_DIR only when all are done."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from eval.kinds.translation_outputs import DIAGNOSTICS
from eval.study.compare import OTHERS, Comparison, weighting
from eval.study.formatting import (
    ADJUSTED,
    FEW,
    OVERALL,
    SPLITS,
    axis_label,
    decimals,
    find_row,
    format_cell,
    format_change,
    matches,
    variant_label,
)
from eval.study.stats import ALPHA, MIN_ITEMS, TIE

COLUMNS = (
    "model", "task", "variant", "metric", "scope", "family", "split", "lang", "n", "items",
    "few_items", "seeds", "value", "seed_std", "delta", "ci_low", "ci_high", "ratio",
    "ratio_low", "ratio_high", "p", "q", "significant", "significant_adjusted",
)  # fmt: skip
# What bolds a cell: `--bold interval` (the default) or `--bold adjusted`.
BOLD = {"interval": "significant", "adjusted": "significant_adjusted"}
HEADS = {"held_in": "learned (held-in)", "held_out": "transferred (held-out)"}


def _sign_cell(comparison: Comparison, axis, model, split, over) -> str:
    for test in comparison.sign_tests:
        if matches(test, axis, model=model, split=split, over=over):
            return f"{test['wins']}–{test['losses']}, p={test['p']:.3g}"
    return ""


def _headline_columns(comparison: Comparison) -> list[tuple[str, dict[str, Any]]]:
    """The macros per split (`all in`, `all out`), the `others` mean, then each family's."""
    columns = [
        (f"all {short}" if split in SPLITS else short, {"scope": "overall", "split": split})
        for split, short in OVERALL.items()
    ]
    for family in comparison.families:
        for split, short in SPLITS.items():
            where = {"scope": "family", "family": family, "split": split}
            columns.append((f"{family} {short}", where))
    return columns


def _axis_table(comparison: Comparison, axis: dict[str, Any], bold: str) -> list[str]:
    digits = decimals(axis)
    present = [
        (name, where)
        for name, where in _headline_columns(comparison)
        if any(matches(r, axis, **where) for r in comparison.rows)
    ]
    splits = [s for s in OVERALL if any(w.get("split") == s for _, w in present)]
    tests = [
        (s, over)
        for over in ("languages", "families")
        for s in splits
        if over == "languages" or s in SPLITS
    ]
    header = [name for name, _ in present] + [f"{over} {OVERALL[s]}" for s, over in tests]
    lines = ["| strategy | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for model in comparison.models:
        cells = []
        for _, where in present:
            row = next((r for r in comparison.rows if matches(r, axis, model=model, **where)), None)
            cells.append(format_cell(row, digits, bold) if row else "")
        cells += [_sign_cell(comparison, axis, model, s, over) for s, over in tests]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    better = "higher" if axis["higher_is_better"] else "lower"
    unit = " (%)" if axis["scale"] == "percent" else ""
    title = f"## {axis_label(axis)}{unit}, {better} is better"
    return [title, "", *lines, "", *_sign_test_notes(comparison, axis)]


def _sign_test_notes(comparison: Comparison, axis: dict[str, Any]) -> list[str]:
    """Where a sign test cannot reach p < ALPHA whatever the outcomes, say so under its table."""
    few = {}
    for test in comparison.sign_tests:
        if matches(test, axis) and test["min_p"] >= ALPHA:
            units = test["wins"] + test["losses"] + test["ties"]
            few[(units, test["over"])] = test["min_p"]
    if not few:
        return []
    named = {
        f"{units} {over if units != 1 else over[:-1]}": p
        for (units, over), p in sorted(few.items())
    }
    parts = list(named)
    smallest = ", ".join(f"{p:.3g} over {part}" for part, p in named.items())
    return [
        f"Sign tests over {_join(parts)} can never reach p < {ALPHA:g}, whatever the outcomes: "
        f"over k languages or families the smallest two-sided p is 2 / 2^k ({smallest}).",
        "",
    ]


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _language_table(comparison: Comparison, axis: dict[str, Any], bold: str) -> list[str]:
    digits = decimals(axis)
    rows = [r for r in comparison.rows if matches(r, axis, scope="language")]
    langs = list(dict.fromkeys((r["family"], r["split"], r["lang"], r["n"]) for r in rows))
    lines = [
        "| family | split | language | n | " + " | ".join(comparison.models) + " |",
        "|---" * (len(comparison.models) + 4) + "|",
    ]
    for family, split, lang, n in langs:
        found = [
            next(r for r in rows if r["lang"] == lang and r["model"] == m)
            for m in comparison.models
        ]
        cells = [format_cell(row, digits, bold) for row in found]
        lines.append(
            f"| {family or ''} | {OVERALL.get(split, split or '')} | {lang} | {n} | "
            + " | ".join(cells)
            + " |"
        )
    return [f"### {axis_label(axis)}", "", *lines, ""]


def _task_table(comparison: Comparison, axes: list[dict[str, Any]], bold: str) -> list[str]:
    header = [axis_label(a) for a in axes]
    lines = ["| strategy | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for model in comparison.models:
        cells = []
        for axis in axes:
            row = next(r for r in comparison.rows if matches(r, axis, model=model, scope="task"))
            cells.append(format_cell(row, decimals(axis), bold))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return ["## Tasks without languages", "", *lines, ""]


def _summary(comparison: Comparison, axes: list[dict[str, Any]], bold: str) -> list[str]:
    """The report's opening: per strategy and metric, what it forgot on the suite's `others`
    languages, learned on held-in ones and transferred to held-out ones, with intervals."""
    overall = {r["split"] for r in comparison.rows if r["scope"] == "overall"}
    splits = [s for s in (OTHERS, *SPLITS) if s in overall]
    others = sorted({r["lang"] for r in comparison.rows if r["split"] == OTHERS and r["lang"]})
    heads = [HEADS.get(s, "forgotten elsewhere (others)") for s in splits]
    lines = [
        "## What each strategy forgot, learned and transferred",
        "",
        f"Changes from `{comparison.base}` [95% interval] of the means in the tables below "
        "(perplexities also as a ratio to the base): forgotten elsewhere on the suite's "
        f"`others:` languages ({', '.join(others)}), learned on the held-in languages, "
        "transferred to their held-out relatives."
        if others
        else "The suite has no `others:` languages, so what a strategy forgets beyond its "
        "families is not measured here (add the base's own language, for one, under "
        f"`others:`). Changes from `{comparison.base}` [95% interval] of the means in the "
        "tables below (perplexities also as a ratio to the base): learned on the held-in "
        "languages, transferred to their held-out relatives.",
        "",
        "| strategy | metric | " + " | ".join(heads) + " |",
        "|---" * (len(heads) + 2) + "|",
    ]
    for model in comparison.models[1:]:
        for axis in axes:
            better = "higher" if axis["higher_is_better"] else "lower"
            cells = []
            for split in splits:
                row = find_row(comparison.rows, axis, model=model, scope="overall", split=split)
                cells.append(format_change(row, decimals(axis), bold) if row else "")
            label = f"{axis_label(axis)} ({better} is better)"
            lines.append(f"| {model} | {label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _method(comparison: Comparison, bold: str) -> str:
    """The paragraph under the summary: what a cell is, its interval and what bold means."""
    strategies = ", ".join(f"`{m}`" for m in comparison.models[1:])
    if bold == BOLD["interval"]:
        bolding = (
            "**Bold** (the default, `--bold interval`): the unadjusted 95% interval excludes 0. "
            "A table holds many cells, and about 1 in 20 of the changes that are really 0 is "
            f"bold by chance. {ADJUSTED}: the change survives the Benjamini-Hochberg "
            "correction over the strategies' cells of its table (a 5% false discovery rate; "
            "`--bold adjusted` bolds these instead)"
        )
    else:
        bolding = (
            f"**Bold** and {ADJUSTED} (`--bold adjusted`): the change survives the "
            "Benjamini-Hochberg correction over the strategies' cells of its table (a 5% false "
            "discovery rate) and its 95% interval excludes 0"
        )
    return (
        f"Strategies {strategies}, scored on the same items as the base (matched by doc id and "
        "prompt hash). Cells: value (change from the base [95% interval]). Intervals: paired "
        f"bootstrap, B = {comparison.resamples} resamples of each language's items with seed "
        f"{comparison.seed}, the same resamples for every model, percentiles 2.5 and 97.5; "
        "family and overall intervals recompute their means on every resample of all their "
        "languages. Intervals resample items with the few-shot demonstrations held fixed, so "
        "they leave out how much a change depends on which demonstrations were drawn (the "
        f"spread over seeds, shown as ± where there are several). {bolding}; the p of a change "
        "is twice the share of resampled changes on the far side of 0, +1 corrected "
        f"(comparison.csv has p and the adjusted q). {FEW}: some language of the cell has "
        f"fewer than {MIN_ITEMS} items, and the cell is never bold: with so few items the "
        "percentile interval is too narrow (in simulations where nothing changed, a 95% "
        "interval excluded 0 in 24% of trials with 3 items, 11% with 10 and 6-7% with 30). "
        "Sign tests (last columns): wins–losses against the base over languages or over "
        f"families, ties within {TIE:g} dropped, exact two-sided binomial p. The sign test "
        "over languages counts a family's languages as independent trials, though related "
        "languages move together, so it overstates the evidence; the one over families does "
        "not, but has few trials (over 5 or fewer it can never reach p < 0.05)."
    )


def report_markdown(
    comparison: Comparison, plots: list[str], notes: list[str] = (), bold: str = "significant"
) -> str:
    """report.md: the forgetting-first summary, how to read it, one table per primary metric,
    per-language tables. `notes` say why a plot is absent; `bold` is the row key that bolds."""
    primary = [a for a in comparison.axes if a["primary"]]
    by_language = [
        a for a in primary if any(matches(r, a, scope="language") for r in comparison.rows)
    ]
    tasks = [a for a in primary if a not in by_language]
    lines = [f"# Strategies against `{comparison.base}`", ""]
    if by_language:
        lines += _summary(comparison, by_language, bold)
    lines += [
        _method(comparison, bold),
        "",
        "How each number is weighted:",
        "",
        *(f"- {scope}: {text}" for scope, text in weighting(comparison).items()),
        "",
    ]
    for name in plots:
        lines += [f"![{name}]({name})", ""]
    for note in notes:
        lines += [note, ""]
    for axis in by_language:
        lines += _axis_table(comparison, axis, bold)
    if tasks:
        lines += _task_table(comparison, tasks, bold)
    if by_language:
        lines += ["## Per language", ""]
        for axis in by_language:
            lines += _language_table(comparison, axis, bold)
    others = [axis_label(a) for a in comparison.axes if not a["primary"]]
    if others:
        lines += [f"Also in comparison.csv and comparison.json: {', '.join(others)}.", ""]
    lines += _outputs_table(comparison)
    if comparison.skipped:
        lines += [f"Not compared (no per-item outcome): {', '.join(comparison.skipped)}.", ""]
    for reason in comparison.refused:
        lines += [reason, ""]
    return "\n".join(lines)


# The report's names of the output shares (`eval.study.outputs`).
OUTPUT_HEADS = {
    "truncation_rate": "cut at a line end",
    "eos_rate": "EOS",
    "limit_rate": "token limit",
    "empty_rate": "empty",
}


def _outputs_table(comparison: Comparison) -> list[str]:
    """Translation outputs per direction, split and model, pooled over the split's languages
    (per family and language in comparison.json)."""
    rows = [r for r in comparison.outputs if r["scope"] == "overall"]
    if not rows:
        return []
    # Directions as compare.py ordered them, then splits, then the models side by side.
    directions = list(dict.fromkeys((r["task"], r["variant"]) for r in rows))
    splits = list(OVERALL)
    rows.sort(
        key=lambda r: (
            directions.index((r["task"], r["variant"])),
            splits.index(r["split"]),
            comparison.models.index(r["model"]),
        )
    )
    quantiles = [name for name in DIAGNOSTICS if name.startswith("length_")]
    heads = [*OUTPUT_HEADS.values(), *(name.removeprefix("length_") for name in quantiles)]
    lines = [
        "## Translation outputs",
        "",
        "Shares of the outputs (in %) whose generation stopped at the end of a line (what "
        "followed was cut), at EOS or at the token limit, and that are empty; output lengths "
        "in characters at the 50th to 99th percentiles. Pooled over the items of the split's "
        "languages; per family and language in comparison.json (`translation_outputs`).",
        "",
        "| task | split | strategy | n | " + " | ".join(heads) + " |",
        "|---" * (len(heads) + 4) + "|",
    ]
    for row in rows:
        variant = row["variant"]
        label = row["task"] if variant is None else f"{row['task']} {variant_label(variant)}"
        rates = [_percent(row[name]) for name in OUTPUT_HEADS]
        lengths = [str(row[name]) for name in quantiles]
        split = OVERALL.get(row["split"], row["split"])
        lines.append(
            f"| {label} | {split} | {row['model']} | {row['n']} | "
            + " | ".join(rates + lengths)
            + " |"
        )
    return [*lines, ""]


def _percent(value: float | None) -> str:
    """A share as a percentage with one decimal; `–` where it was not logged."""
    return "–" if value is None else f"{100 * value:.1f}"


def finite(value: Any) -> Any:
    """JSON without NaN or infinities: a non-finite float becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def comparison_json(comparison: Comparison, bold: str = "significant") -> dict[str, Any]:
    """Everything in the comparison as one JSON-ready object."""
    return finite(
        {
            "format": "surgery-compare/2",
            "base": comparison.base,
            "models": comparison.models,
            "folders": comparison.folders,
            "inputs": comparison.inputs,
            "bootstrap": {
                "resamples": comparison.resamples,
                "seed": comparison.seed,
                "interval": "paired bootstrap percentile 2.5/97.5",
                "p": "min(1, 2 * (1 + min(#{d <= 0}, #{d >= 0})) / (B + 1)) over resampled "
                "changes d",
                "min_items": MIN_ITEMS,
            },
            "adjustment": {
                "method": "Benjamini-Hochberg (scipy.stats.false_discovery_control)",
                "over": "the strategies' cells of each table of each metric: headline "
                "(overall, others and family means), language, task",
                "alpha": ALPHA,
            },
            "bold": bold,
            "weighting": weighting(comparison),
            "axes": comparison.axes,
            "rows": comparison.rows,
            "sign_tests": comparison.sign_tests,
            "skipped": comparison.skipped,
            "refused": comparison.refused,
            **({"translation_outputs": comparison.outputs} if comparison.outputs else {}),
        }
    )


def write_report(comparison: Comparison, folder: Path, bold: str = "interval") -> list[str]:
    """Write report.md, comparison.csv, comparison.json and the PNG plots into `folder`.

    Args:
        bold: what bolds a cell: `interval` (its unadjusted 95% interval excludes 0) or
            `adjusted` (it survives Benjamini-Hochberg over its table).

    Returns:
        One line for each plot that could not be drawn, saying why (also in report.md).
    """
    from eval.study.plots import plot_heatmap, plot_tradeoff

    key = BOLD[bold]
    drawn = [plot_heatmap(comparison, folder, key), plot_tradeoff(comparison, folder, key)]
    plots = [name for name, _ in drawn if name]
    notes = [why for _, why in drawn if why]
    text = report_markdown(comparison, plots, notes, key)
    (folder / "report.md").write_text(text, encoding="utf-8")
    with (folder / "comparison.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in finite(comparison.rows):
            writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})
    data = comparison_json(comparison, bold)
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False)
    (folder / "comparison.json").write_text(text + "\n", encoding="utf-8")
    return notes
