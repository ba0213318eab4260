"""One progress bar for every streamed pass over tensor bytes: on stderr, quiet with -q."""

from __future__ import annotations

import sys

from tqdm import tqdm


def byte_progress(total: int, desc: str, quiet: bool) -> tqdm:
    """A tqdm bar counting bytes (KiB, MiB, ...) that disappears when done."""
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        disable=quiet,
        file=sys.stderr,
        leave=False,
    )


def notice(kind: str, message: str) -> None:
    """One line on stderr that the run goes on despite (`warning`) or did on its own (`note`)."""
    tqdm.write(f"{kind}: {message}", file=sys.stderr)
