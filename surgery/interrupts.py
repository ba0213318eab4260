"""SIGINT, SIGTERM and SIGHUP as one exception, raised where the main thread is.

Imported first by `cli.py`: for the `surgery` command the handlers are installed here, before
the heavy imports, so an early Ctrl-C exits quietly (code 2). A program importing `cli` keeps its
own handlers.
"""

from __future__ import annotations

import signal
import sys


class Interrupted(SystemExit):
    """SIGINT, SIGTERM or SIGHUP, raised where the main thread is, so every `finally` and
    `except BaseException` (the staging folder's cleanup) runs; exits with code 2."""

    def __init__(self, signum: int) -> None:
        super().__init__(2)
        self.signame = signal.Signals(signum).name


_interrupted = False


def _on_signal(signum: int, frame: object) -> None:
    # The first signal unwinds the run; later ones are ignored so that cleanup finishes.
    global _interrupted
    if not _interrupted:
        _interrupted = True
        stop = Interrupted(signum)
        # Said here, not where it is caught: a signal during the imports is never caught.
        sys.stderr.write(f"\nerror: interrupted by {stop.signame}; no partial output is left\n")
        raise stop


def install_signal_handlers() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise `Interrupted` (the `surgery` command only: a
    program importing this module keeps its own handlers)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_signal)


# Installed on import, before cli.py's other imports, so an early Ctrl-C exits quietly (code 2).
if sys.argv[0].rsplit("/", 1)[-1] in ("surgery", "cli.py"):
    install_signal_handlers()
