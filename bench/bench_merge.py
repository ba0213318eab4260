"""Benchmark: every `surgery merge` method against `mergekit-yaml` on the same YAML.

Reuses bench_engine's Llama-shaped bf16 checkpoints (a base and three experts; about 0.97B
parameters = 1.9 GB each by default) and, per method, runs `surgery merge CONFIG OUT` and
`mergekit-yaml CONFIG OUT`, one process tree at a time with warm inputs, printing wall time, CPU
time (user + system) and peak private memory (RssAnon) of each and their ratios
(docs/benchmarks.md's merge table). linear always runs first: each method's wall and CPU times
are also given over linear's in the same run (`x linear`, `CPU x linear`: a shared machine
changes CPU times less), and della, arcee_fusion and ramplus_tl's over their arithmetic floor
(bench_floor.py, `x floor`). The load average before and after is printed with the table.
Run by hand:  python bench/bench_merge.py [--work DIR] [--layers 19] [--hidden 2048]
              [--methods ties,slerp] [--repeat 3] [--no-mergekit]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import Timed, ensure_checkpoints, median_timed, mergekit, size_arguments, timed
from bench_floor import FLOORS, floor_times
from measure import Measurement, median_run

# Methods whose bound is their own arithmetic's floor (bench_floor.py), not linear's time.
ARITHMETIC_FLOORS = [m for m, floors in FLOORS.items() if "arithmetic floor" in floors]

# Per-method config bodies; {b} is the base, {e1}..{e3} the experts, {n} the layer count.
_TASK = "base_model: {b}\nmodels:\n" + "".join(
    f"  - model: {{e{i}}}\n    parameters: {{{{weight: {w}, density: 0.5}}}}\n"
    for i, w in ((1, 0.5), (2, 0.3), (3, 0.2))
)
_BASE_AND_EXPERTS = "base_model: {b}\nmodels:\n  - model: {e1}\n  - model: {e2}\n  - model: {e3}\n"
CONFIGS = {
    "linear": "models:\n"
    + "".join(f"  - model: {{e{i}}}\n    parameters: {{{{weight: 1.0}}}}\n" for i in (1, 2, 3)),
    "task_arithmetic": _TASK,
    "ties": _TASK,
    "dare_ties": _TASK,
    "dare_linear": _TASK,
    "breadcrumbs": _TASK,
    "breadcrumbs_ties": _TASK,
    "della": _TASK,
    "della_linear": _TASK,
    "slerp": "base_model: {b}\nmodels:\n  - model: {b}\n  - model: {e1}\n"
    "parameters: {{t: [0, 0.5, 1]}}\n",
    "nuslerp": "base_model: {b}\nmodels:\n"
    "  - model: {e1}\n    parameters: {{weight: 0.4}}\n"
    "  - model: {e2}\n    parameters: {{weight: 0.6}}\n",
    "model_stock": _BASE_AND_EXPERTS,
    "sce": _BASE_AND_EXPERTS + "parameters: {{select_topk: 0.5}}\n",
    "karcher": "models:\n  - model: {e1}\n  - model: {e2}\n  - model: {e3}\n",
    "multislerp": "base_model: {b}\nmodels:\n"
    + "".join(
        f"  - model: {{e{i}}}\n    parameters: {{{{weight: {w}}}}}\n"
        for i, w in ((1, 0.5), (2, 0.3), (3, 0.2))
    ),
    "nearswap": "base_model: {b}\nmodels:\n  - model: {b}\n  - model: {e1}\n"
    "parameters: {{t: 0.001}}\n",
    "arcee_fusion": "base_model: {b}\nmodels:\n  - model: {b}\n  - model: {e1}\n",
    "ram": _BASE_AND_EXPERTS,
    "ramplus_tl": _BASE_AND_EXPERTS + "parameters: {{r: 0.1, alpha: 0.2}}\n",
    "passthrough": "slices:\n"
    "  - sources: [{{model: {e1}, layer_range: [0, {lo}]}}]\n"
    "  - sources: [{{model: {b}, layer_range: [{lo}, {n}]}}]\n",
}


def config_text(method: str, work: Path, layers: int) -> str:
    paths = {"b": work / "base", **{f"e{i}": work / f"expert{i}" for i in (1, 2, 3)}}
    body = CONFIGS[method].format(n=layers, lo=layers // 2, **{k: str(v) for k, v in paths.items()})
    return f"merge_method: {method}\ndtype: bfloat16\n{body}"


def run(
    work: Path,
    layers: int,
    hidden: int,
    methods: list[str],
    repeat: int = 1,
    with_mergekit: bool = True,
) -> list:
    """(method, ours, mergekit's or None, arithmetic floor s or None) per method; linear first
    (every row's time is also shown over linear's, from the same run)."""
    names = ("base", "expert1", "expert2", "expert3")
    ensure_checkpoints(work, layers, hidden, names)
    inputs = [str(work / n) for n in names]
    results = []
    for method in ["linear", *(m for m in methods if m != "linear")]:
        text = config_text(method, work, layers)
        path = work / f"{method}.yml"
        path.write_text(text)
        out = work / f"out-{method}"
        ours_runs, theirs_runs = [], []
        for _ in range(repeat):  # alternated, so that a slow spell of the machine hits both
            command = [sys.executable, "-m", "cli", "merge", str(path), str(out), "-q"]
            ours_runs.append(timed(command, out, inputs))
            if with_mergekit:
                theirs_runs.append(mergekit(text, work, f"out-mk-{method}", inputs))
        ours = median_timed(ours_runs)
        theirs = median_run(theirs_runs) if theirs_runs else None
        floor = None
        if method in ARITHMETIC_FLOORS:
            times = floor_times(work, method, repeat, merge=False)["arithmetic floor"]
            floor = statistics.median(times)
        mk = f", mergekit {theirs.seconds:.1f} s" if theirs else ""
        print(f"{method}: surgery {ours.seconds:.1f} s{mk}", file=sys.stderr)
        results.append((method, ours, theirs, floor))
    return results


def report(results: list[tuple[str, Timed, Measurement | None, float | None]]) -> str:
    """The table: surgery's wall and CPU times over linear's, over its arithmetic floor (della,
    arcee_fusion, ramplus_tl) and over mergekit's, and the memory of both."""
    lines = [
        "| method | surgery s | x linear | CPU s | CPU x linear | floor s | x floor "
        "| mergekit s | ratio | surgery MB | mergekit MB | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    linear = next(ours for method, ours, _, _ in results if method == "linear")
    for method, ours, theirs, floor in results:
        failed = ours.returncode != 0 or (theirs is not None and theirs.returncode != 0)
        floors = f"{floor:.1f} | {ours.seconds / floor:.2f}x" if floor else "- | -"
        theirs_columns = (
            f"{theirs.seconds:.1f} | {ours.seconds / theirs.seconds:.2f}x" if theirs else "- | -"
        )
        memory = (
            f"{theirs.peak_anon / 2**20:.0f} | {ours.peak_anon / theirs.peak_anon:.2f}x"
            if theirs
            else "- | -"
        )
        lines.append(
            f"| {method}{' (failed)' if failed else ''} | {ours.seconds:.1f} | "
            f"{ours.seconds / linear.seconds:.2f}x | {ours.cpu:.1f} | "
            f"{ours.cpu / linear.cpu:.2f}x | {floors} | {theirs_columns} | "
            f"{ours.peak_anon / 2**20:.0f} | {memory} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(CONFIGS))
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool (median time)")
    parser.add_argument(
        "--no-mergekit", action="store_true", help="time surgery alone (no mergekit columns)"
    )
    args = size_arguments(__doc__, "bench/out", parser)
    methods = args.methods.split(",")
    before = os.getloadavg()[0]
    results = run(args.work, args.layers, args.hidden, methods, args.repeat, not args.no_mergekit)
    print(report(results))
    print(f"load average (1 min): {before:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
