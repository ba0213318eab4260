"""Benchmark: the floor of a streamed merge, the real merge with the avoidable work taken out.

Model Stock needs the whole tensors' angles before it can write the first element, so a
streamed merge reads its four inputs twice. For `model_stock` this runs, on bench_merge's
checkpoints and config, `surgery merge` three ways, each in its own process with warm inputs:
- `model_stock`: the merge as it is;
- `null, 2 passes`: a kernel that decodes the four inputs in the first pass, decodes them again
  in the second and writes the base's values (rounding, overflow check, sha256 and write kept);
- `null, 1 pass`: the same without the first pass (no longer a Model Stock: a bound on any).
What the null kernels take is what no arithmetic can win back; docs/benchmarks.md compares it
with a quarter of mergekit's time.

For `della`, `della_linear`, `arcee_fusion` and `ramplus_tl` (`--method`, several separated by
commas), whose arithmetic is heavy (a sort of each row and a draw per element; two exp and a log;
counts per element), the floor is `arithmetic floor`: one pass that does the method's own
arithmetic once, with what its reduction passes find (rescaling factors, the threshold, the
lambdas) replaced by constants. The merge's time over it is what the reduction passes cost.
Each table gives wall and CPU seconds (user + system) and peak private memory, and the load.
Run by hand:  python bench/bench_floor.py [--work DIR] [--repeat 3] [--method della,della_linear]
              (after bench_merge.py --methods METHOD)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

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


def _della_floor() -> None:
    """DELLA's map alone: its masks and sums once, no rescaling pass (factor 1)."""
    from surgery.engine.ops.merge import task_arithmetic

    def prepare(self, inputs):
        return [self._sparsifier(inputs, p, i) for p, i in enumerate(self.others)]

    task_arithmetic.TaskArithmetic.prepare = prepare


def _ramplus_floor() -> None:
    """ramplus_tl's map alone: lambdas of 1 instead of its counting pass."""
    from surgery.engine.ops.merge import ram

    ram.Ram.prepare = lambda self, inputs: [1.0] * (len(self.inputs) - 1)


def _arcee_floor() -> None:
    """arcee_fusion in one pass: each chunk's softmax divergences and fused values, against a
    constant threshold instead of the quantiles of the whole tensor's importances."""
    import numpy as np

    from surgery.engine.ops.merge import arcee_fusion as arcee

    def map_part(self, inputs, out, part, state):
        threshold = inputs.work(0.001)
        for start, (base, other) in inputs.chunks(self.step, part, reuse=True):
            change = np.subtract(other, base)
            rows = arcee.row_divergence(base.copy(), other, self.row)
            change *= arcee.scaled(change, rows, out=other) >= threshold
            out.put(start, np.add(base, change, out=change))

    arcee.ArceeFusion.prepare = lambda self, inputs: None
    arcee.ArceeFusion.map_part = map_part


# Per method: the floor runs, each a (name, patch) the child process applies before merging.
FLOORS = {
    "model_stock": {
        "null, 2 passes": lambda: _null_kernel(2),
        "null, 1 pass": lambda: _null_kernel(1),
    },
    "della": {"arithmetic floor": _della_floor},
    "della_linear": {"arithmetic floor": _della_floor},
    "arcee_fusion": {"arithmetic floor": _arcee_floor},
    "ramplus_tl": {"arithmetic floor": _ramplus_floor},
}


def _child(method: str, floor: str, config: str, out: str) -> None:
    FLOORS[method][floor]()
    import cli

    sys.argv = ["surgery", "merge", "-q", config, out]
    cli.main()


def floor_times(
    work: Path, method: str, repeat: int, *, merge: bool = True
) -> dict[str, list[float]]:
    """Seconds of each run (the merge unless `merge` is False, then its floors), alternated
    `repeat` times."""
    runs = floor_runs(work, method, repeat, merge=merge)
    return {name: [r.seconds for r in timed] for name, timed in runs.items()}


def floor_runs(work: Path, method: str, repeat: int, *, merge: bool = True) -> dict[str, list]:
    """Each run's measurement (wall and CPU seconds, peak private memory): the merge unless
    `merge` is False, then its floors, alternated `repeat` times."""
    from bench_engine import timed  # imports torch: not in the child processes

    config, out = work / f"{method}.yml", work / "out-floor"
    if not config.is_file():
        sys.exit(f"{config} is missing: run bench/bench_merge.py --methods {method} first")
    inputs = [str(work / name) for name in INPUTS]
    me = [sys.executable, str(Path(__file__).resolve())]
    commands = {}
    if merge:
        commands[method] = [sys.executable, "-m", "cli", "merge", "-q", str(config), str(out)]
    for floor in FLOORS[method]:
        commands[floor] = [*me, "--child", method, floor, str(config), str(out)]
    runs: dict[str, list] = {name: [] for name in commands}
    for _ in range(repeat):  # alternated, so that a slow spell hits all of them
        for name, command in commands.items():
            result = timed(command, out, inputs)
            if result.returncode != 0:
                sys.exit(f"{name} failed (exit {result.returncode})")
            runs[name].append(result)
    return runs


def table(method: str, runs: dict[str, list]) -> str:
    """One method's rows: its merge, then each floor, with the merge's wall and CPU time over
    each."""
    merge = runs[method]
    wall, cpu = statistics.median(r.seconds for r in merge), statistics.median(r.cpu for r in merge)
    lines = [
        "| run | median s | runs s | CPU s | peak MB | merge over it | CPU over it |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, timed in runs.items():
        listed = ", ".join(f"{r.seconds:.2f}" for r in timed)
        median = statistics.median(r.seconds for r in timed)
        cpu_median = statistics.median(r.cpu for r in timed)
        peak = max(r.peak_anon for r in timed) / 2**20
        lines.append(
            f"| {name} | {median:.2f} | {listed} | {cpu_median:.2f} | {peak:.0f} | "
            f"{wall / median:.2f}x | {cpu / cpu_median:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("bench/out"))
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median time)")
    parser.add_argument(
        "--method", default="model_stock", help=f"one or several of {', '.join(sorted(FLOORS))}"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, *args.rest)
        return
    methods = args.method.split(",")
    if unknown := [m for m in methods if m not in FLOORS]:
        parser.error(f"--method: no floor for {', '.join(unknown)}")
    for method in methods:
        before = os.getloadavg()[0]
        runs = floor_runs(args.work, method, args.repeat)
        print(f"\n{method} ({os.cpu_count()} cores, load {before:.1f} to {os.getloadavg()[0]:.1f})")
        print(table(method, runs))


if __name__ == "__main__":
    main()
