"""Reading text data files: .txt, .jsonl and .jsonl.gz, one set of conventions for train and eval.

- ``.txt``: documents separated by blank lines; lines inside a document keep their newlines.
- ``.jsonl`` / ``.jsonl.gz``: one JSON object per non-blank line; a document is its ``text``
  field (MADLAD-400's layout).
- Any file ending in ``.gz`` is gunzipped; text is UTF-8 (a byte-order mark is dropped).

Everything streams (a MADLAD-400 shard need not fit in memory). Every problem is raised as the
caller's error type (`error=`), with a message that starts ``file:line:`` like a compiler's, so
a bad row in a large file can be found without a debugger.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from surgery.core.errors import SurgeryError

# Suffixes understood, longest first so `.jsonl.gz` wins over `.gz`.
JSONL_SUFFIXES = (".jsonl.gz", ".jsonl")
TEXT_SUFFIXES = (".txt",)
SUFFIXES = JSONL_SUFFIXES + TEXT_SUFFIXES


class DataFileError(SurgeryError):
    """A data file is missing, unreadable or malformed."""


ErrorType = Callable[[str], Exception]


def where(path: Path, line: int | None) -> str:
    """``file:line`` (or just ``file``), the start of every message about a data file."""
    return f"{path}:{line}" if line is not None else str(path)


def has_suffix(path: Path, suffixes: tuple[str, ...] = SUFFIXES) -> bool:
    """True when the file name ends with one of `suffixes`."""
    return path.name.endswith(suffixes)


def iter_lines(path: Path, error: ErrorType = DataFileError) -> Iterator[tuple[int, str]]:
    """Yield `(line number, line without its line ending)` of a UTF-8 file, gunzipping `.gz`.

    Args:
        path: the file.
        error: exception type raised on a problem (called with the message).

    Raises:
        error: the file is missing, not UTF-8, or not valid gzip.
    """
    if not path.is_file():
        raise error(f"{path}: no such file")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        # Bytes in, decoded line by line, so a decoding error names the exact line.
        with opener(path, "rb") as handle:
            for line_no, raw in enumerate(handle, start=1):
                try:
                    # utf-8-sig on line 1 drops a byte-order mark that would break json.loads.
                    line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise error(f"{path}:{line_no}: not UTF-8 text ({exc.reason})") from None
                yield line_no, line.rstrip("\n").rstrip("\r")
    except (gzip.BadGzipFile, EOFError, OSError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None


def iter_jsonl(
    path: Path, error: ErrorType = DataFileError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line number, object)` for every non-blank line of a JSON-lines file.

    Raises:
        error: unreadable file, bad JSON, or a line that is not a JSON object.
    """
    for line_no, line in iter_lines(path, error):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{line_no}: bad JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise error(f"{path}:{line_no}: expected a JSON object")
        yield line_no, data


def iter_paragraphs(path: Path, error: ErrorType = DataFileError) -> Iterator[tuple[int, str]]:
    """Yield `(first line number, document)` of a text file: documents separated by blank lines.

    A file without blank lines is one document; lines inside a document keep their newlines.

    Raises:
        error: the file is missing or unreadable.
    """
    start, lines = 0, []
    for line_no, line in iter_lines(path, error):
        if line.strip():
            start = start or line_no
            lines.append(line)
        elif lines:
            yield start, "\n".join(lines)
            start, lines = 0, []
    if lines:
        yield start, "\n".join(lines)


def iter_documents(path: Path, error: ErrorType = DataFileError) -> Iterator[str]:
    """Every non-empty document of a file: paragraphs of a .txt, the `text` of each JSON line.

    JSON rows whose `text` is empty or blank are skipped (nothing to read or score).

    Raises:
        error: unreadable file, bad JSON, or a row without a string ``text`` field.
    """
    if not has_suffix(path, JSONL_SUFFIXES):
        for _, text in iter_paragraphs(path, error):
            yield text
        return
    for line_no, data in iter_jsonl(path, error):
        text = data.get("text")
        if not isinstance(text, str):
            raise error(f"{path}:{line_no}: no string 'text' field")
        if text.strip():
            yield text
