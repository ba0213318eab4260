"""Safe output folders: refuse risky paths, build beside OUT, rename into place when done."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from surgery.core.errors import OutputError


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(out: Path, inputs: Sequence[Path], force: bool) -> None:
    """Refuse an OUT that is, lies inside, or contains an input, and an existing OUT unless forced.

    Raises:
        OutputError: with the reason.
    """
    target = out.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if _is_within(target, source):
            raise OutputError(f"output {out} is or lies inside the input {given}; choose another")
        if _is_within(source, target):
            raise OutputError(f"output {out} contains the input {given}; choose another")
    if target.exists() and not force:
        raise OutputError(f"output {out} already exists; pass --force to replace it")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def staged_output(out: Path, carry: Sequence[str] = ()) -> Iterator[Path]:
    """Yield a temporary folder beside `out`; on success it replaces `out` by rename.

    On any error (or Ctrl-C) the temporary folder and any parent folders created for it are
    removed, so a failed run leaves nothing behind.

    Args:
        out: the output folder.
        carry: names of entries of an existing `out` moved into the new output just before it
            replaces `out` (entries the new output also has are not carried).
    """
    out = Path(out).absolute()
    created = [p for p in reversed(out.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    _remove(staging)
    staging.mkdir()
    try:
        yield staging
        for name in carry:
            if (out / name).exists() and not (staging / name).exists():
                os.replace(out / name, staging / name)
        if out.exists() or out.is_symlink():
            # Move the old output aside first so OUT is never missing a complete version for long.
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            os.replace(staging, out)
            _remove(old)
        else:
            os.replace(staging, out)
    except BaseException:
        _remove(staging)
        for folder in reversed(created):
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        raise
