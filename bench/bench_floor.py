"""Benchmark: the floor of a streamed Model Stock, the real merge with its arithmetic taken out.

Model Stock needs the whole tensors' angles before it can write the first element, so a
streamed merge reads its four inputs twice. This runs, on bench_merge's checkpoints and config,
`surgery merge` three ways, each in its own process with warm inputs:
- `model_stock`: the merge as it is;
- `null, 2 passes`: a kernel that decodes the four inputs in the first pass, decodes them again
  in the second and writes the base's values (rounding, overflow check, sha256 and write kept);
- `null, 1 pass`: the same without the first pass (no longer a Model Stock: a bound on any).
What the null kernels take is what no arithmetic can win back; docs/benchmarks.md compares it
with a quarter of mergekit's time.
Run by hand:  python bench/bench_floor.py [--work DIR] [--repeat 3]   (after bench_merge.py)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measure import measure

INPUTS = ("base", "expert1", "expert2", "expert3")


def _null_kernel(passes: int) -> None:
    """Replace Model Stock's arithmetic by decoding alone (in this process only)."""
    from surgery.engine.ops.merge import model_stock

    def prepare(self, inputs):
        for _ in range(passes - 1):
            for _ in inputs.chunks(reuse=True):
                pass
        return 0.0

    def map_part(self, inputs, out, part, state):
        for start, (base, *_models) in inputs.chunks(part=part, reuse=True):
            out.put(start, base)

    model_stock.ModelStock.prepare = prepare
    model_stock.ModelStock.map_part = map_part


def _child(passes: int, config: str, out: str) -> None:
    _null_kernel(passes)
    import cli

    sys.argv = ["surgery", "merge", "-q", config, out]
    cli.main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("bench/out"))
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median time)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, *args.rest)
        return
    config, out = args.work / "model_stock.yml", args.work / "out-floor"
    if not config.is_file():
        sys.exit(f"{config} is missing: run bench/bench_merge.py --methods model_stock first")
    inputs = [str(args.work / name) for name in INPUTS]
    me = [sys.executable, str(Path(__file__).resolve())]
    commands = {
        "model_stock": [sys.executable, "-m", "cli", "merge", "-q", str(config), str(out)],
        "null, 2 passes": [*me, "--child", "2", str(config), str(out)],
        "null, 1 pass": [*me, "--child", "1", str(config), str(out)],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeat):  # alternated, so that a slow spell hits all three
        for name, command in commands.items():
            result = measure(command, inputs=inputs)
            shutil.rmtree(out, ignore_errors=True)
            if result.returncode != 0:
                sys.exit(f"{name} failed (exit {result.returncode})")
            times[name].append(result.seconds)
    print("| run | median s | runs s |\n|---|---|---|")
    for name, runs in times.items():
        listed = ", ".join(f"{t:.2f}" for t in runs)
        print(f"| {name} | {statistics.median(runs):.2f} | {listed} |")


if __name__ == "__main__":
    main()
