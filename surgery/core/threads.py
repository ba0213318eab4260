"""How many CPU threads a command computes with: one rule for every command.

torch starts one thread per core. When another process holds a core, those threads wait for
each other at every barrier, and small operations (a tiny model's layers, one token of
generation) become many times slower: `surgery demo --quick` went from 109 s to over 900 s with
one of two cores busy. So a command takes the cores that are free when it starts:

    threads = cores this process may use (sched_getaffinity) - cores busy now, at least 1

Cores busy now come from a short sample of /proc/stat over those cores (the load average lags
by a minute). Commands of this toolkit running at the same time (search workers, a study's units)
register what they took; a command that finds others shares their cores evenly with them rather
than taking what they hold. `--threads N` or SURGERY_THREADS=N override the rule.

Only the standard library is imported here: `surgery --help` must not pay for torch.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from surgery.core.errors import SurgeryError

ENV = "SURGERY_THREADS"
# Long enough to see a busy core as busy (100 clock ticks), short enough to go unnoticed.
SAMPLE_SECONDS = 0.1


@dataclass(frozen=True)
class ThreadPlan:
    """The threads a command uses, and why.

    Attributes:
        threads: torch's intra-op threads (and the engine's workers).
        usable: cores this process may run on.
        busy: cores found busy at the start (rounded), by any process.
        others: other surgery commands running now, sharing the cores.
        source: "--threads", SURGERY_THREADS, or "rule".
    """

    threads: int
    usable: int
    busy: int = 0
    others: int = 0
    source: str = "rule"

    def note(self) -> str | None:
        """The one line a user sees when the rule took fewer threads than cores, else None."""
        if self.source != "rule" or self.threads >= self.usable:
            return None
        why = [f"{self.busy} of {self.usable} cores busy"]
        if self.others:
            why.append(f"shared with {self.others} other surgery process(es)")
        return (
            f"note: using {self.threads} thread(s): {', '.join(why)} "
            f"(--threads N or {ENV}=N to choose)"
        )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; all cores where that is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_times(cpus: Collection[int] | None) -> dict[str, tuple[int, int]]:
    """{cpuN: (idle ticks, total ticks)} from /proc/stat, for the cores in `cpus` (all when
    None)."""
    times = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq ...
        times[name] = (ticks[3] + ticks[4], sum(ticks))
    return times


def busy_cores(seconds: float = SAMPLE_SECONDS) -> float:
    """How many of this process's cores were busy over a short sample, as a float (0.0-N).

    Falls back to the 1-minute load average where /proc/stat cannot be read.
    """
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        before = _cpu_times(cpus)
        time.sleep(seconds)
        after = _cpu_times(cpus)
    except (OSError, ValueError):
        return min(os.getloadavg()[0], usable_cores()) if hasattr(os, "getloadavg") else 0.0
    busy = 0.0
    for name, (idle, total) in after.items():
        idle0, total0 = before.get(name, (idle, total))
        if total > total0:
            busy += 1.0 - (idle - idle0) / (total - total0)
    return busy


def parse_threads(value: str | int | None, where: str) -> int | None:
    """A thread count from an option or the environment (None when not given).

    Raises:
        SurgeryError: not a whole number of at least 1.
    """
    if value is None or value == "":
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise SurgeryError(f"{where} {value!r}: give a whole number of threads, at least 1")
    return threads


def share(usable: int, busy: float, claims: Collection[int]) -> int:
    """The rule's arithmetic: the free cores, plus those other surgery processes hold, shared
    evenly between them and this one; at least 1.

    Args:
        usable: cores this process may use.
        busy: cores busy now (measured; includes what the other surgery processes compute on).
        claims: threads each other live surgery process took.
    """
    free = max(0, usable - round(busy))
    if not claims:
        return max(1, free)
    shared = min(usable, free + sum(claims))
    return max(1, shared // (len(claims) + 1))


def choose_threads(
    requested: int | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    usable: int | None = None,
    busy: float | None = None,
    claims: Collection[int] | None = None,
) -> ThreadPlan:
    """The threads a command should use: `requested`, else SURGERY_THREADS, else the rule.

    Args:
        requested: `--threads N` (None when not given).
        environ: where SURGERY_THREADS is read.
        usable, busy, claims: the machine's state (measured when None; tests fake them).

    Raises:
        SurgeryError: SURGERY_THREADS is not a positive whole number.
    """
    usable = usable_cores() if usable is None else usable
    if requested is not None:
        return ThreadPlan(requested, usable, source="--threads")
    from_env = parse_threads(environ.get(ENV), ENV)
    if from_env is not None:
        return ThreadPlan(from_env, usable, source=ENV)
    claims = list(Registry().claims()) if claims is None else list(claims)
    busy = busy_cores() if busy is None else busy
    return ThreadPlan(share(usable, busy, claims), usable, round(busy), len(claims))


class Registry:
    """The threads each running surgery process took: one small file per process id in a folder
    of the user's temporary directory, read and written under a lock."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or Path(tempfile.gettempdir()) / f"surgery-threads-{os.getuid()}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def claims(self, own: int | None = None) -> list[int]:
        """The threads of every other live process that registered (dead ones are dropped)."""
        own = os.getpid() if own is None else own
        try:
            entries = list(self.folder.glob("[0-9]*"))
        except OSError:
            return []
        taken = []
        for entry in entries:
            pid = int(entry.name)
            if pid == own:
                continue
            if not _alive(pid):
                entry.unlink(missing_ok=True)
                continue
            with contextlib.suppress(OSError, ValueError):
                taken.append(int(entry.read_text()))
        return taken

    def register(self, threads: int, pid: int | None = None) -> None:
        """Record that process `pid` (this one by default) computes on `threads` threads; the
        record goes when the process exits."""
        pid = os.getpid() if pid is None else pid
        entry = self.folder / str(pid)
        with self._locked():
            entry.write_text(str(threads))
        if pid == os.getpid() and entry not in _at_exit:
            _at_exit.add(entry)
            atexit.register(entry.unlink, missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process with a recycled id: still running
    return True


_current: ThreadPlan | None = None
_at_exit: set[Path] = set()  # this process's records, removed when it exits


def use_threads(requested: int | None = None, *, quiet: bool = False) -> ThreadPlan:
    """Choose this process's threads by the rule (or `requested`), apply them to torch (now if
    it is loaded, else through OMP_NUM_THREADS when it loads) and register them; say why on
    stderr when the machine is busy.

    Returns:
        The plan applied (recorded by results.json, the training record and the recipe).
    """
    global _current
    plan = choose_threads(requested)
    os.environ["OMP_NUM_THREADS"] = str(plan.threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(plan.threads)
    with contextlib.suppress(OSError):  # an unwritable temp folder costs the sharing only
        Registry().register(plan.threads)
    note = plan.note()
    if note and not quiet:
        print(note, file=sys.stderr)
    _current = plan
    return plan


def current_threads() -> int:
    """The threads chosen for this process (`use_threads`), else its usable cores."""
    return _current.threads if _current is not None else usable_cores()


def rebalance_threads() -> ThreadPlan | None:
    """Choose again, quietly, between units of work (a search's trials) when the rule chose:
    a worker that started alone gives up cores to workers that started after it.

    Returns:
        The new plan, or None where the user chose (`--threads`, SURGERY_THREADS) or no plan
        was made (a Python caller).
    """
    if _current is None or _current.source != "rule":
        return None
    return use_threads(quiet=True)
