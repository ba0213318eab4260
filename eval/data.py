"""Readers for eval data files: JSON lines (optionally gzipped) and plain text.

The files are read by `surgery.core.textfiles` (shared with training); this module adds rows
with typed field access for the task readers.

Every problem is an `EvalDataError` that names the file and, where it applies, the line, so a bad
row in a 900-row Belebele file can be found and fixed without a debugger.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.errors import EvalDataError, data_error
from surgery.core.textfiles import (
    JSONL_SUFFIXES,
    SUFFIXES,
    TEXT_SUFFIXES,
    has_suffix,
    iter_documents,
    iter_jsonl,
    iter_lines,
)

__all__ = [
    "JSONL_SUFFIXES",
    "SUFFIXES",
    "TEXT_SUFFIXES",
    "Row",
    "doc_id",
    "has_suffix",
    "read_documents",
    "read_jsonl",
    "read_lines",
    "text_sha256",
]

# Fields that identify a row in the data sets eval reads, tried in order (Belebele's questions
# are numbered within a passage, its link).
_ID_FIELDS = (("id",), ("link", "question_number"))


@dataclass(frozen=True)
class Row:
    """One JSON object from a JSON-lines file, with where it came from (for error messages)."""

    path: Path
    line: int
    data: dict[str, Any]

    def field(self, name: str) -> Any:
        """Return a required field.

        Args:
            name: the field name.

        Returns:
            Its value.

        Raises:
            EvalDataError: the row has no such field.
        """
        if name not in self.data:
            columns = ", ".join(self.data) or "none"
            raise data_error(self.path, self.line, f"missing field {name!r} (columns: {columns})")
        return self.data[name]

    def string(self, name: str) -> str:
        """Return a required field that must be a string (possibly empty).

        Raises:
            EvalDataError: missing or not a string.
        """
        value = self.field(name)
        if not isinstance(value, str):
            raise data_error(self.path, self.line, f"field {name!r} must be a string")
        return value

    def text(self, name: str) -> str:
        """Return a required field that must be a non-empty string.

        Raises:
            EvalDataError: missing, not a string, or empty.
        """
        value = self.field(name)
        if not isinstance(value, str) or not value.strip():
            raise data_error(self.path, self.line, f"field {name!r} must be a non-empty string")
        return value

    def label(self, name: str, choices: range) -> int:
        """Return a required integer field (int or digit string) that must lie in `choices`.

        Raises:
            EvalDataError: missing, not an integer, or out of range.
        """
        value = self.field(name)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise data_error(self.path, self.line, f"field {name!r} must be an integer")
        if value not in choices:
            allowed = f"{choices.start}..{choices.stop - 1}"
            raise data_error(self.path, self.line, f"{name} {value} out of range {allowed}")
        return value


def read_jsonl(path: Path) -> list[Row]:
    """Read a JSON-lines file (`.jsonl` or `.jsonl.gz`): one object per non-blank line.

    Args:
        path: the file.

    Returns:
        The rows, in file order.

    Raises:
        EvalDataError: missing file, bad JSON, a line that is not an object, or no rows at all.
    """
    rows = [Row(path, line_no, data) for line_no, data in iter_jsonl(path, EvalDataError)]
    if not rows:
        raise data_error(path, None, "empty: no rows")
    return rows


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield `(line number, line without its line ending)` of a UTF-8 file, gunzipping `.gz`.

    Raises:
        EvalDataError: the file is missing, not UTF-8, or not valid gzip.
    """
    return iter_lines(path, EvalDataError)


def read_documents(path: Path) -> list[str]:
    """Non-empty documents of a .txt (blank-line-separated) or .jsonl[.gz] (`text`) file.

    Raises:
        EvalDataError: missing, unreadable, or a row without a string `text`.
    """
    return list(iter_documents(path, EvalDataError))


def doc_id(data: dict[str, Any], index: int) -> str:
    """A stable id of a row within its file, for matching items across runs (samples' doc_id).

    Args:
        data: the row's fields.
        index: its position in the file (0-based), used when the row has no id of its own.

    Returns:
        The row's ``id``, Belebele's ``link#question_number``, or the index, as a string.
    """
    for names in _ID_FIELDS:
        if all(data.get(name) not in (None, "") for name in names):
            return "#".join(str(data[name]) for name in names)
    return str(index)


def text_sha256(text: str) -> str:
    """sha256 hex digest of a string's UTF-8 bytes (samples' prompt_sha256)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
