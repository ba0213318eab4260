"""OUT and its resumable checkpoints around a run: what goes at the start, what stays after a
failure, what the saved checkpoint carries over."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)


def _main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def discard_old_checkpoints(checkpoints: Path, discard: bool) -> None:
    """--force without --resume (`discard`): the resumable checkpoints of the run being replaced
    would mix with this run's (rotation, resume), so they go now; the rest of OUT goes at the
    save."""
    if discard and _main_process() and checkpoints.is_dir():
        logger.info("--force: deleting the previous run's %s", checkpoints)
        shutil.rmtree(checkpoints)


@contextlib.contextmanager
def kept_on_failure(checkpoints: Path, output: Path) -> Iterator[None]:
    """A run that fails or is interrupted (Ctrl-C, SIGTERM) leaves no empty OUT/checkpoints
    (which would make the same command refuse to run), only the resumable checkpoints it saved,
    and says so."""
    try:
        yield
    except BaseException:
        if _main_process():
            remove_empty_folders(checkpoints, output)
            if checkpoints.is_dir():
                logger.warning(
                    "kept %s (resumable checkpoints of this run): continue with --resume",
                    checkpoints,
                )
        raise


def carried_entries(checkpoints: Path, output: Path, keep: bool, force: bool) -> list[str]:
    """What of an existing OUT the saved checkpoint keeps: anything the Trainer wrote there, but
    the resumable checkpoints only with --keep-checkpoints (`keep`). With --force, OUT's other
    entries belong to the output being replaced and are not kept.

    The Trainer creates OUT/checkpoints when it starts; left empty, it is removed now (and OUT
    with it when that leaves OUT empty), so that a save interrupted before its final rename
    leaves no OUT, or OUT exactly as a resumable interrupted run.
    """
    remove_empty_folders(checkpoints, output)
    if not output.is_dir():
        return []
    if force:
        return [checkpoints.name] if keep and checkpoints.is_dir() else []
    return sorted(p.name for p in output.iterdir() if keep or p.name != checkpoints.name)


def remove_empty_folders(checkpoints: Path, output: Path) -> None:
    """Remove OUT/checkpoints when the Trainer left it empty, then OUT when that leaves it empty
    (never anything that holds a file)."""
    for folder in (checkpoints, output):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
