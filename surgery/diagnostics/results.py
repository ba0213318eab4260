"""What the diagnostics share: which columns are metrics, result files, tables and progress."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from surgery.diagnostics.metric_kinds import is_output_rate, is_stderr


def metric_names(rows: Sequence[dict]) -> list[str]:
    """The metrics worth plotting: float columns other than alpha, standard errors and the
    shares of translation outputs (integers are counts: n, tokens, lengths)."""
    names = (
        [k for k in rows[0] if k != "alpha" and not is_stderr(k) and not is_output_rate(k)]
        if rows
        else []
    )
    return [k for k in names if all(isinstance(r.get(k), float) for r in rows)]


def json_ready(data: object) -> object:
    """`data` with NaN and infinities as None: JSON has no NaN (bare `NaN` breaks most parsers);
    null means "no value" (within noise, no standard error)."""
    if isinstance(data, dict):
        return {key: json_ready(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [json_ready(item) for item in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    return data


def write_results(rows: list[dict], folder: Path, stem: str, config: dict) -> list[Path]:
    """`stem`.json (rows + config, strict JSON) and `stem`.csv."""
    json_path, csv_path = folder / f"{stem}.json", folder / f"{stem}.csv"
    document = json_ready({"config": config, "rows": rows})
    json_path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return [json_path, csv_path]


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A plain-text table with aligned columns (numbers to 4 significant digits)."""

    def text(value: object) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[text(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def announce(command: str, step: int, total: int, detail: str, quiet: bool) -> None:
    """One line on stderr before each point of a long diagnostic: `sweep: 2 of 11: alpha 0.1`."""
    if not quiet:
        print(f"{command}: {step} of {total}: {detail}", file=sys.stderr, flush=True)
