"""What the diagnostics share: which columns are metrics, result files, tables and progress."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def metric_names(rows: Sequence[dict]) -> list[str]:
    """The metrics worth plotting: float columns other than alpha (integers are counts: n,
    tokens)."""
    names = [k for k in rows[0] if k != "alpha"] if rows else []
    return [k for k in names if all(isinstance(r.get(k), float) for r in rows)]


def write_results(rows: list[dict], folder: Path, stem: str, config: dict) -> list[Path]:
    """`stem`.json (rows + config) and `stem`.csv."""
    json_path, csv_path = folder / f"{stem}.json", folder / f"{stem}.csv"
    json_path.write_text(json.dumps({"config": config, "rows": rows}, indent=2) + "\n")
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
