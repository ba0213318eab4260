"""A thin reader of `surgery eval --suite` results folders, until the suite runner's
`eval.study.results` (which owns the format) replaces it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.errors import CompareError

FORMAT = "surgery-suite-results/1"


def read_results(folder: Path) -> dict[str, Any]:
    """`folder/results.json`, checked to be a suite results file.

    Raises:
        CompareError: no results.json, not valid JSON, or another format.
    """
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise CompareError(f"{folder}: not a suite results folder (no results.json)")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CompareError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(results, dict) or results.get("format") != FORMAT:
        raise CompareError(f"{path}: not a {FORMAT} file")
    return results


def read_samples(folder: Path, unit: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-item lines of one unit, in scoring order.

    Raises:
        CompareError: the samples file is missing or a line is not a JSON object.
    """
    path = Path(folder) / unit["samples"]
    if not path.is_file():
        raise CompareError(f"{path}: samples of unit {unit['id']} missing")
    lines = []
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except ValueError:
                line = None
            if not isinstance(line, dict) or "doc_id" not in line:
                raise CompareError(f"{path}:{number}: not a samples line with a doc_id")
            lines.append(line)
    return lines
