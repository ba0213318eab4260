"""Benchmark: `surgery compare` at the study's size, on synthetic results folders.

Builds results folders as `surgery eval --suite` writes them (tests/support/study_dirs.py,
through eval.study.results) for M models over L languages, with realistic item counts: Belebele
900 items per language, Global-PIQA 300, FLORES 1012 sentences in both directions, perplexity 300
documents. Language i goes to family i % 5, as held-out when i % 5 == 4: the fifth family holds
only held-out languages and is dropped (a family needs a held-in language), so the languages
scored are the other four families' held-in ones, 26 of `--languages 32`, in 130 (task, language)
cells (FLORES counts once per direction). Then times the comparison (loading, matching, paired
bootstrap of every cell, macros, sign tests) and the report (markdown, CSV, JSON, plots)
separately.

The target: 9 models at `--languages 32` (26 scored) x 4 tasks with B = 10,000 in under 2 minutes
on 2 idle cores.

`--memory` measures instead the peak private memory (RssAnon, sampled by bench/measure.py) of
one process that resamples one cell of M models with n items (n = 2,000 and 20,000 by default,
20,000 being a whole validation split), loading included. One whole count matrix would cost
24 x B x n bytes (4.5 GiB at B = 10,000 and n = 20,000); compare draws it in blocks of rows.

Run by hand:  python bench/bench_compare.py [--models 9] [--languages 32] [--resamples 10000]
              python bench/bench_compare.py --models 3 --languages 5 --scale 0.1   (a quick check)
              python bench/bench_compare.py --memory [--items 2000,20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.measure import measure
from eval.study.compare import compare, default_jobs
from eval.study.report import write_report
from tests.support.study_dirs import Study
from tests.support.study_dirs import write_results as write_dir

ROOT = Path(__file__).resolve().parent.parent
ITEMS = {"belebele": 900, "piqa": 300, "flores": 1012, "ppl": 300}


def build_study(languages: int, scale: float) -> Study:
    """Five families; every fifth language held out."""
    families: dict[str, dict[str, list[str]]] = {
        f"fam{i}": {"held_in": [], "held_out": []} for i in range(5)
    }
    for i in range(languages):
        split = "held_out" if i % 5 == 4 else "held_in"
        families[f"fam{i % 5}"][split].append(f"l{i:02d}_Latn")
    n = {task: max(5, round(count * scale)) for task, count in ITEMS.items()}
    tasks = {
        "ppl": {"kind": "ppl", "path": "madlad/{lang2}/", "n": n["ppl"]},
        "belebele": {"kind": "belebele", "path": "b/{lang}.jsonl", "shots": 2, "n": n["belebele"]},
        "piqa": {"kind": "piqa", "path": "p/{lang}.jsonl", "shots": 2, "n": n["piqa"]},
        "flores": {
            "kind": "flores",
            "dir": "flores/",
            "directions": ["eng_Latn-{lang}", "{lang}-eng_Latn"],
            "shots": 2,
            "n": n["flores"],
        },
    }
    return Study(families={k: v for k, v in families.items() if v["held_in"]}, tasks=tasks)


# One cell's resampling in a fresh process: load the folders, match items, resample.
CELL = """
import sys
from eval.study.compare import cells_of, compute_cell, load_runs
runs = load_runs(sys.argv[1], sys.argv[2:-1])
(cell,) = cells_of(runs[0].results)
compute_cell(runs, cell, int(sys.argv[-1]), 0)
"""


def memory(models: int, items: list[int], resamples: int) -> None:
    """Peak RssAnon of one cell's comparison (Belebele-like 0/1 outcomes) per item count."""
    print(f"one cell, {models} models, B = {resamples}: peak RssAnon of the process")
    for n in items:
        study = Study(
            families={"fam": {"held_in": ["l00_Latn"], "held_out": []}},
            tasks={"belebele": {"kind": "belebele", "path": "b/{lang}.jsonl", "n": n}},
        )
        with tempfile.TemporaryDirectory() as tmp:
            folders = [
                str(write_dir(Path(tmp) / f"m{i}", study, f"m{i}", 0.1 * i, seed=i))
                for i in range(models)
            ]
            command = [sys.executable, "-c", CELL, *folders, str(resamples)]
            result = measure(command, env={"PYTHONPATH": str(ROOT)})
        if result.returncode:
            raise SystemExit(f"the cell's process failed ({result.returncode})")
        estimate = 24 * resamples * n / 2**20
        print(
            f"n = {n:6d}: {result.peak_anon / 2**20:7.0f} MiB in {result.seconds:5.1f} s "
            f"(one whole count matrix would be {estimate:.0f} MiB)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=9, help="base included")
    parser.add_argument("--languages", type=int, default=32)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the item counts")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--memory", action="store_true", help="peak memory of one cell instead")
    parser.add_argument("--items", default="2000,20000", help="with --memory: item counts n")
    args = parser.parse_args()
    if args.memory:
        memory(args.models, [int(n) for n in args.items.split(",")], args.resamples)
        return
    study = build_study(args.languages, args.scale)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        folders = [
            write_dir(root / f"m{i}", study, "base" if i == 0 else f"strategy{i}", 0.1 * i, seed=i)
            for i in range(args.models)
        ]
        built = time.perf_counter() - start
        start = time.perf_counter()
        comparison = compare(
            folders[0], folders[1:], resamples=args.resamples, seed=0, jobs=args.jobs
        )
        compared = time.perf_counter() - start
        (root / "report").mkdir()
        start = time.perf_counter()
        write_report(comparison, root / "report")
        reported = time.perf_counter() - start
    cells = len({(r["task"], r["variant"], r["lang"]) for r in comparison.rows if r["lang"]})
    print(
        f"{args.models} models x {args.languages} languages x {len(study.tasks)} tasks "
        f"({cells} (task, language) cells, FLORES both directions), B = {args.resamples}, "
        f"jobs = {args.jobs}, item scale {args.scale}"
    )
    print(f"build the synthetic folders: {built:7.1f} s (not part of the comparison)")
    print(f"compare:                     {compared:7.1f} s ({len(comparison.rows)} rows)")
    print(f"report and plots:            {reported:7.1f} s")
    print(f"compare + report:            {compared + reported:7.1f} s (target: under 120 s)")


if __name__ == "__main__":
    main()
