"""Run a command and measure its wall time and peak private memory (RssAnon).

RssAnon (from /proc/PID/status) counts anonymous pages only: the memory a process really owns.
Plain RSS would also count the page cache of memory-mapped or read files, which the kernel can
drop at will. Linux keeps no high-water mark for RssAnon, so it is sampled every 10 ms
over the whole process tree; a spike shorter than that can be missed.
"""

from __future__ import annotations

import compileall
import functools
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Measurement:
    """One run: seconds of wall time, peak private memory in bytes, exit code."""

    seconds: float
    peak_anon: int
    returncode: int


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _anon_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_anon_bytes(pid: int) -> int:
    """RssAnon summed over a process and its descendants."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += _anon_bytes(current)
        stack.extend(_children(current))
    return total


@functools.cache
def compile_project() -> None:
    """Byte-compile the project's modules once, as installing its wheel would. An editable
    install leaves them to be compiled on first import, and where PYTHONDONTWRITEBYTECODE is
    set (this machine sets it) every run compiled them again: 0.19 s of each command's start-up
    that mergekit, installed with its bytecode, never paid."""
    for name in ("surgery", "train", "eval"):
        compileall.compile_dir(ROOT / name, quiet=1)
    compileall.compile_file(ROOT / "cli.py", quiet=1)


def warm(paths: Sequence[str]) -> None:
    """Read every file under `paths` once, so each tool starts with its inputs in the page cache
    (a tool measured first would otherwise pay for disk reads the others skip)."""
    buffer = bytearray(16 * 2**20)
    for root in paths:
        if os.path.isfile(root):
            files = [root]
        else:
            files = [os.path.join(d, name) for d, _, names in os.walk(root) for name in names]
        for file in files:
            with open(file, "rb", buffering=0) as handle:
                while handle.readinto(buffer):
                    pass


def measure(
    command: Sequence[str],
    env: dict | None = None,
    interval: float = 0.01,
    inputs: Sequence[str] = (),
) -> Measurement:
    """Run `command`, sampling the RssAnon of its process tree until it exits.

    `inputs` are read first (see `warm`), and dirty pages left by earlier runs are flushed, so
    that no run pays for another's disk traffic. Sampled every 10 ms: enough for runs of seconds,
    and less CPU taken from a command that keeps every core busy.
    """
    compile_project()
    warm(inputs)
    os.sync()
    start = time.perf_counter()
    process = subprocess.Popen(
        list(command), env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL
    )
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_anon_bytes(process.pid))
        time.sleep(interval)
    return Measurement(time.perf_counter() - start, peak, process.returncode)


def median_run(runs: Sequence[Measurement]) -> Measurement:
    """Several runs of one command as one: the median wall time (this machine is shared and
    noisy), the largest peak, the worst exit code."""
    return Measurement(
        statistics.median(r.seconds for r in runs),
        max(r.peak_anon for r in runs),
        max(runs, key=lambda r: abs(r.returncode)).returncode,
    )
