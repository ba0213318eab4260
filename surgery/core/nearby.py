"""A missing local path named with the nearest names in its folder (`ckpt/plian` ->
`ckpt/plain`), so a typo reads as a typo."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

# At most this many suggestions, each at least this similar (difflib's ratio) to the name given.
_SUGGESTIONS = 3
_CUTOFF = 0.6


def nearest_names(spec: str | Path) -> list[str] | None:
    """The entries of `spec`'s folder closest to its last part, spelled as `spec` is
    (`ckpt/plain` for `ckpt/plian`), best first; None when that folder is not a local folder."""
    text = str(spec).rstrip("/") or str(spec)
    folder, name = os.path.split(text)
    try:
        entries = [entry.name for entry in os.scandir(folder or ".")]
    except OSError:  # no such folder, not a folder, or unreadable: nothing local to suggest
        return None
    close = difflib.get_close_matches(name, entries, n=_SUGGESTIONS, cutoff=_CUTOFF)
    return [os.path.join(folder, match) for match in close]


def no_such_path(spec: str | Path) -> str:
    """`SPEC: no such file or folder`, and the nearest names in its folder where there are any
    (`ckpt/plian: no such file or folder (nearest: ckpt/plain)`)."""
    close = nearest_names(spec)
    hint = f" (nearest: {', '.join(close)})" if close else ""
    return f"{spec}: no such file or folder{hint}"
