"""Benchmark: the thread rule on a shared machine (a command alone, then beside a busy core).

Each workload runs four ways, each process measured by bench/measure.py (wall time):
- alone, with the rule (SURGERY_THREADS unset);
- beside a busy loop on one core (another process running `while True: pass`), with the rule;
- alone and beside the loop with torch's default, one thread per core (SURGERY_THREADS set to
  every usable core: what the commands did before the rule).
It prints each time and the ratio of busy to alone, with the machine's load before it starts.

Workloads:
- eval: `surgery eval MODEL -t belebele:FILE:shots=2` on 30 Belebele-format items written
  by bench/bench_suite.py's data writer; MODEL is a seeded random bf16 Llama (hidden 384, 6
  layers) or `--model PATH` (e.g. bench/fetch_smollm2.py's SmolLM2-135M);
- demo: `surgery demo --quick` with the rule only (several minutes alone; `--demo` adds it).

Run by hand, alone on an idle machine (check `uptime`):
    python bench/bench_threads.py [--model PATH] [--repeats 3] [--demo]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_suite import build_model, write_data  # noqa: E402
from bench.measure import measure, median_run  # noqa: E402


def _surgery(*args: object) -> list[str]:
    return [sys.executable, "-m", "cli", *map(str, args)]


def _timed(make: Callable[[], list[str]], env: dict[str, str], repeats: int, busy: bool) -> float:
    """Median wall time of `repeats` runs (each a new command from `make`), each beside a fresh
    busy loop when `busy`."""
    runs = []
    for _ in range(repeats):
        command = make()
        loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            run = measure(command, env=env)
        finally:
            if loop is not None:
                loop.kill()
                loop.wait()
        if run.returncode != 0:
            sys.exit(f"failed with exit code {run.returncode}: {' '.join(command)}")
        runs.append(run)
    return median_run(runs).seconds


def _row(
    name: str, make: Callable[[], list[str]], repeats: int, cores: int, default: bool = True
) -> None:
    ways = {"rule": {"SURGERY_THREADS": ""}}
    if default:
        ways["torch default"] = {"SURGERY_THREADS": str(cores)}
    times = {
        (way, busy): _timed(make, env, repeats, busy)
        for way, env in ways.items()
        for busy in (False, True)
    }
    for way in ways:
        alone, busy = times[(way, False)], times[(way, True)]
        print(f"| {name} | {way} | {alone:.1f} | {busy:.1f} | {busy / alone:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a local model folder [a random Llama]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--demo", action="store_true", help="also time `surgery demo --quick`")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; load average before: {os.getloadavg()[0]:.2f}")
    print("| workload | threads | alone s | one core busy s | busy/alone |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = write_data(root / "data", {"belebele": 30, "piqa": 1, "flores": 1, "ppl": 1})
        model = args.model or build_model(root / "model", texts, hidden=384, layers=6)
        data = root / "data/belebele/ind_Latn.jsonl"
        task = f"belebele:{data}:shots=2"
        evaluation = _surgery("eval", model, "-t", task, "-q")
        _row("eval belebele 2-shot, 30 items", lambda: evaluation, args.repeats, cores)
        if args.demo:
            runs = iter(range(100))  # a new folder each run: a demo reuses finished stages
            demo = lambda: _surgery("demo", "--quick", "-o", root / f"demo-{next(runs)}")  # noqa: E731
            # The rule only: with torch's default beside a busy core it ran past 15 minutes.
            _row("demo --quick", demo, 1, cores, default=False)


if __name__ == "__main__":
    main()
