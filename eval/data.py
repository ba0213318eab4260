"""Readers for eval data files: JSON lines (optionally gzipped) and plain text.

Every problem is an `EvalDataError` that names the file and, where it applies, the line, so a bad
row in a 900-row Belebele file can be found and fixed without a debugger.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.errors import data_error

# Suffixes the readers understand, longest first so `.jsonl.gz` wins over `.gz`.
JSONL_SUFFIXES = (".jsonl.gz", ".jsonl")
TEXT_SUFFIXES = (".txt",)


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
            raise data_error(self.path, self.line, f"missing field {name!r}")
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


def has_suffix(path: Path, suffixes: tuple[str, ...]) -> bool:
    """True when the file name ends with one of `suffixes`."""
    return path.name.endswith(suffixes)


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield `(line number, line without its newline)` of a UTF-8 text file, gunzipping `.gz`.

    Raises:
        EvalDataError: the file is missing, not UTF-8, or not valid gzip.
    """
    if not path.is_file():
        raise data_error(path, None, "no such file")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        # Bytes in, decoded line by line, so a decoding error names the exact line.
        with opener(path, "rb") as handle:
            for line_no, raw in enumerate(handle, start=1):
                try:
                    # utf-8-sig on line 1 drops a byte-order mark that would break json.loads.
                    line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                except UnicodeDecodeError as error:
                    raise data_error(path, line_no, f"not UTF-8 text ({error.reason})") from None
                yield line_no, line.rstrip("\n").rstrip("\r")
    except (gzip.BadGzipFile, EOFError, OSError) as error:
        raise data_error(path, None, f"cannot read: {error}") from None


def read_jsonl(path: Path) -> list[Row]:
    """Read a JSON-lines file (`.jsonl` or `.jsonl.gz`): one object per non-blank line.

    Args:
        path: the file.

    Returns:
        The rows, in file order.

    Raises:
        EvalDataError: missing file, bad JSON, a line that is not an object, or no rows at all.
    """
    rows = []
    for line_no, line in read_lines(path):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise data_error(path, line_no, f"bad JSON: {error.msg}") from None
        if not isinstance(data, dict):
            raise data_error(path, line_no, "expected a JSON object")
        rows.append(Row(path, line_no, data))
    if not rows:
        raise data_error(path, None, "empty: no rows")
    return rows


def read_paragraphs(path: Path) -> list[tuple[int, str]]:
    """Read a plain-text file as documents separated by blank lines.

    A file without blank lines is one document; lines inside a document keep their newlines.

    Returns:
        `(first line number, document text)` pairs.

    Raises:
        EvalDataError: missing, unreadable, or no text at all.
    """
    documents: list[tuple[int, str]] = []
    start, lines = 0, []
    for line_no, line in read_lines(path):
        if line.strip():
            start = start or line_no
            lines.append(line)
        elif lines:
            documents.append((start, "\n".join(lines)))
            start, lines = 0, []
    if lines:
        documents.append((start, "\n".join(lines)))
    if not documents:
        raise data_error(path, None, "empty: no text")
    return documents
