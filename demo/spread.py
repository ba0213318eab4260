"""`surgery demo --seeds N`: the demo once per seed, and what holds across the runs.

One run's figures rest on one training run: floating-point sums differ between CPUs and
training amplifies the difference, so the same command prints other values on another machine.
Which conclusions hold is measured here, over seeds (each seed draws another world, other
initial weights and another data order): every cell shows the median change from the base and
its range over the seeds, bold where every seed's 95% interval excludes 0 on the same side.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

from demo.pipeline import AXES, log, run_demo
from surgery.engine.output_paths import check_resumable_folder

PPL_AXES = {label for label, task, _ in AXES if task == "ppl"}


def machine() -> str:
    """The processor and core count, as /proc/cpuinfo names them (where it exists)."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.read_text().splitlines()
            if ln.startswith("model name")
        ]
        name = models[0] if models else name
    return f"{name}, {os.cpu_count()} cores"


def run_seeds(
    out_dir: str | Path, *, quick: bool, seeds: list[int], device: str | None = None
) -> Path:
    """Run (or resume) the demo once per seed into OUT_DIR/seed-S and write OUT_DIR/spread.md;
    returns its path."""
    out = Path(out_dir)
    check_resumable_folder(out)
    tables = {}
    for seed in seeds:
        log(f"== seed {seed} ({len(tables) + 1} of {len(seeds)})")
        run_demo(out / f"seed-{seed}", quick=quick, seed=seed, device=device)
        tables[seed] = json.loads((out / f"seed-{seed}" / "results.json").read_text())
    table = spread_table(tables)
    mode = "--quick " if quick else ""
    text = f"""# surgery demo {mode}over {len(seeds)} seeds

Seeds {", ".join(map(str, seeds))} on {machine()}. Each cell: the median over the seeds of the
change from the base (perplexity: the ratio to the base, x; chrF: the difference), then its
smallest and largest value. **Bold**: in every seed the change's 95% interval (the comparison's
paired bootstrap) excludes 0 on the same side, so the conclusion held in every run. The Base
row gives its values. An expert's row is its own family's
(the family's languages differ between seeds).

{table}
"""
    path = out / "spread.md"
    path.write_text(text)
    log(f"spread: {path}")
    print(table)
    return path


def _change(entry: dict, ppl: bool) -> float:
    """A cell's change from the base: a ratio for perplexity, a difference otherwise."""
    base = entry["value"] - entry["delta"]
    return entry["value"] / base if ppl else entry["delta"]


def _holds(entries: list[dict]) -> bool:
    """Every seed's interval excludes 0, all on the same side, on enough items (the
    comparison never calls a change on too few items)."""
    signs = {entry["delta"] > 0 for entry in entries}
    enough = not any(entry.get("few_items") for entry in entries)
    return enough and all(entry["significant"] for entry in entries) and len(signs) == 1


def _number(value: float, ppl: bool) -> str:
    if not ppl:
        return f"{value:+.1f}"
    return f"x{value:.3g}" if value < 1000 else f"x{value:,.0f}"


def spread_cell(entries: list[dict], ppl: bool) -> str:
    """`x20.1 (x17 to x27)`: the median change over the seeds and its range, bold where the
    conclusion held in every seed; the base (no change): its values the same way."""
    if entries[0]["delta"] is None:
        values = [entry["value"] for entry in entries]
        return f"{statistics.median(values):.3g} ({min(values):.3g} to {max(values):.3g})"
    changes = [_change(entry, ppl) for entry in entries]
    text = (
        f"{_number(statistics.median(changes), ppl)} "
        f"({_number(min(changes), ppl)} to {_number(max(changes), ppl)})"
    )
    return f"**{text}**" if _holds(entries) else text


def spread_table(tables: dict[int, list[dict]]) -> str:
    """The Markdown table over the seeds' results.json tables (rows in the same order)."""
    labels = [label for label, _, _ in AXES]
    runs = list(tables.values())
    lines = ["| strategy | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for index, row in enumerate(runs[0]):
        cells = [
            spread_cell([run[index][label] for run in runs], label in PPL_AXES) for label in labels
        ]
        lines.append(f"| {row['strategy']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
