"""click parameter types that mark the paths a command writes.

Every option or argument naming a file or folder a command creates uses one of these types, so
a test can list them from the click commands themselves (a new one cannot be forgotten) and check
that each goes through `surgery.engine.output_paths`. The types only mark: the check needs the
command's inputs and --force, so the command calls it, before any work.
"""

from __future__ import annotations

import click


class OutputFile(click.Path):
    """A result file the command writes (JSON, CSV, JSONL, a plot); checked by
    `surgery.engine.output_paths.check_output_file`. `dir_okay=True` for an option that names a
    folder in another mode (`eval -o` with `--suite`)."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("dir_okay", False)
        super().__init__(**kwargs)


class OutputFolder(click.Path):
    """An output folder the command creates (a checkpoint, a sweep, a report); checked by
    `surgery.engine.output_paths.check_output` (or a command's own rules built on it)."""
