"""The eval wrapper's exception types: `SurgeryError`s, so the CLI prints one line, exits 2."""

from __future__ import annotations

from pathlib import Path

from surgery.core.errors import SurgeryError


class EvalDataError(SurgeryError):
    """A data file for an eval task is missing, empty or malformed."""


class MissingDataError(EvalDataError):
    """Data a task names does not exist: a dataset's config, a language's file.

    A suite run with ``--allow-missing`` skips such a unit and lists it, as it does a missing
    local file; every other data error stays an error.
    """


class TaskSpecError(SurgeryError):
    """A task string that does not parse, or names an unknown task or option."""


class ModelError(SurgeryError):
    """A model eval cannot score: not a causal LM, no tokenizer, or an unusable device or dtype."""


def data_error(path: Path, line: int | None, message: str) -> EvalDataError:
    """Build an `EvalDataError` whose message starts with `file:line:` like a compiler's.

    Args:
        path: the data file.
        line: 1-based line number, or None when the problem concerns the whole file.
        message: what is wrong.

    Returns:
        The exception, for the caller to raise.
    """
    where = f"{path}:{line}" if line is not None else str(path)
    return EvalDataError(f"{where}: {message}")


class SuiteError(SurgeryError):
    """A suite file that does not parse, or a results folder that belongs to another run."""


class CompareError(SurgeryError):
    """Results folders `surgery compare` cannot compare item by item."""
