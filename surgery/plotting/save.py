"""Saving a figure with what drew it: the command, and a hash of this plotting package, so a
figure older than the code that draws it is found."""

from __future__ import annotations

import hashlib
import shlex
import sys
from functools import cache
from pathlib import Path

from surgery.core.errors import OutputError
from surgery.plotting.style import DPI, close

# What a plot option may be called: formats matplotlib's Agg backend writes, chosen by suffix.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
# The PNG text keys the metadata goes under.
COMMAND_KEY = "Command"
HASH_KEY = "Plotting-Hash"


def check_plot_path(path: str | Path) -> None:
    """Refuse a plot file name whose suffix is not a format the plots are written in (a missing
    suffix included: matplotlib would silently add .png), before any work.

    Raises:
        OutputError: with the suffixes allowed.
    """
    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise OutputError(f"plot {path}: give a file name ending in {', '.join(PLOT_SUFFIXES)}")


@cache
def plotting_hash() -> str:
    """The first 12 hex digits of the SHA-256 of this package's source files (names and
    bytes, in name order): it changes whenever the house style or a helper changes."""
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


def invoked_command() -> str:
    """The command line this process was started with, as a shell would take it back
    (`surgery drift base trained --plot drift.png`)."""
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def _metadata(suffix: str, command: str) -> dict[str, str]:
    """The metadata of a figure file in the keys its format allows."""
    stamp = f"plotting {plotting_hash()}"
    if suffix == ".png":
        return {COMMAND_KEY: command, HASH_KEY: plotting_hash()}
    if suffix == ".pdf":
        return {"Subject": command, "Keywords": stamp}
    return {"Description": command, "Keywords": stamp}


def save_figure(fig, path: str | Path, command: str | None = None) -> Path:
    """Write `fig` to `path` (.png, .pdf or .svg) at the house resolution, with the command
    that drew it (default: this process's command line) and `plotting_hash()` in its metadata,
    then close it.

    Raises:
        OutputError: a suffix matplotlib is not asked to write.
    """
    path = Path(path)
    check_plot_path(path)
    metadata = _metadata(path.suffix.lower(), command or invoked_command())
    try:
        fig.savefig(path, dpi=DPI, metadata=metadata)
    finally:
        close(fig)
    return path


def figure_metadata(path: str | Path) -> dict[str, str]:
    """The command and plotting hash a PNG was saved with ({} for a PNG without them)."""
    from PIL import Image

    with Image.open(path) as image:
        text = dict(getattr(image, "text", {}) or {})
    return {key: text[key] for key in (COMMAND_KEY, HASH_KEY) if key in text}
