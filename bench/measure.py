"""Run a command and measure its wall time and peak private memory (RssAnon).

RssAnon (from /proc/PID/status) counts anonymous pages only: the memory a process really owns.
Plain RSS would also count the page cache of memory-mapped or read files, which the kernel can
drop at will. Linux keeps no high-water mark for RssAnon, so it is sampled every millisecond
over the whole process tree; a spike shorter than that can be missed.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass


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


def measure(
    command: Sequence[str], env: dict | None = None, interval: float = 0.001
) -> Measurement:
    """Run `command`, sampling the RssAnon of its process tree until it exits.

    Dirty pages left by earlier runs are flushed first, so that no run pays for another's
    writeback.
    """
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
