"""Benchmark: `surgery extract-lora` against `mergekit-extract-lora` on the same two checkpoints.

Reuses bench_engine's Llama-shaped bf16 checkpoints (about 0.97B parameters = 1.9 GB each by
default; TRAINED is bench_engine's `expert1`, BASE its `base`) and runs, one process tree at a
time with warm inputs, `surgery extract-lora --rank R BASE TRAINED OUT` (full SVD, and with
`--svd randomized`) and `mergekit-extract-lora --max-rank R` (CPU), printing wall time and peak
private memory (RssAnon) of each and their ratios.
Run by hand:  python bench/bench_extract_lora.py [--work DIR] [--layers 19] [--hidden 2048]
              [--rank 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import ensure_checkpoints, size_arguments, timed
from measure import Measurement


def run(work: Path, layers: int, hidden: int, rank: int) -> list[tuple[str, Measurement]]:
    ensure_checkpoints(work, layers, hidden, ("base", "expert1"))
    base, trained = str(work / "base"), str(work / "expert1")
    ours = [sys.executable, "-m", "cli", "extract-lora", "--rank", str(rank), "-q", base, trained]
    commands = {
        "surgery (full SVD)": [*ours, str(work / "out-lora")],
        "surgery --svd randomized": [*ours, "--svd", "randomized", str(work / "out-lora")],
        "mergekit-extract-lora": [
            "mergekit-extract-lora",
            "--model",
            trained,
            "--base-model",
            base,
            "--out-path",
            str(work / "out-lora"),
            "--max-rank",
            str(rank),
            "--quiet",
        ],
    }
    results = []
    for label, command in commands.items():
        result = timed(command, work / "out-lora", [base, trained])
        print(
            f"{label}: {result.seconds:.1f} s, {result.peak_anon / 2**20:.0f} MiB", file=sys.stderr
        )
        results.append((label, result))
    return results


def report(results: list[tuple[str, Measurement]]) -> str:
    reference = results[-1][1]
    lines = ["| tool | s | x mergekit | peak MB | x mergekit |", "|---|---|---|---|---|"]
    for label, result in results:
        flag = "" if result.returncode == 0 else " (failed)"
        lines.append(
            f"| {label}{flag} | {result.seconds:.1f} | {result.seconds / reference.seconds:.2f}x | "
            f"{result.peak_anon / 2**20:.0f} | {result.peak_anon / reference.peak_anon:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=32)
    args = size_arguments(__doc__, "bench/out", parser)
    print(report(run(args.work, args.layers, args.hidden, args.rank)))


if __name__ == "__main__":
    main()
