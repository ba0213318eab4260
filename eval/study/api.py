"""The study's Python API: a comparison written into a report folder, as `surgery compare` does.

from eval.study.api import compare_into
comparison, notes = compare_into("runs/base", ["runs/dense", "runs/soup"], "report")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eval.study.compare import Comparison, compare
from eval.study.report import write_report
from surgery.engine.output_dir import staged_output
from surgery.engine.output_paths import check_output


def compare_into(
    base: str | Path,
    others: Sequence[str | Path],
    out: str | Path,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    jobs: int = 1,
    bold: str = "interval",
    force: bool = False,
    progress: bool = False,
) -> tuple[Comparison, list[str]]:
    """Compare `others`' results folders with `base`'s and write the report folder `out`
    (report.md, comparison.csv, comparison.json, plots), all at once or not at all.

    Args:
        base, others: `surgery eval --suite` results folders.
        resamples, seed, jobs, progress: see `eval.study.compare.compare`.
        bold: see `eval.study.report.write_report`.
        force: replace `out` if it exists (never an input).

    Returns:
        The comparison (its `warnings` for the caller to show) and one note per plot that
        could not be drawn.

    Raises:
        OutputError: `out` is an input, lies inside one, or exists without `force`.
        CompareError: folders that cannot be compared item by item.
    """
    base, out = Path(base), Path(out)
    others = [Path(folder) for folder in others]
    check_output(out, [base, *others], force)
    comparison = compare(base, others, resamples=resamples, seed=seed, jobs=jobs, progress=progress)
    with staged_output(out) as staging:
        notes = write_report(comparison, staging, bold)
    return comparison, notes
