"""Where tensor bytes come from: a small interface, so the engine never cares how bytes arrive.

Today a local file read with `pread` (no shared file position, no page-cache copies held by
Python); the interface leaves room for HTTP range reads of Hub shards.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from surgery.errors import CheckpointError


class ByteSource(Protocol):
    """Random-access bytes of one file."""

    path: Path
    size: int

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes starting at `offset`."""
        ...


class LocalFile:
    """A local file opened read-only; reads with `os.preadv`, copies with `copy_file_range`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` from `offset`; a short file is a truncated checkpoint."""
        done = 0
        while done < len(buffer):
            got = os.preadv(self.fd, [buffer[done:]], offset + done)
            if got == 0:
                raise CheckpointError(f"{self.path}: unexpected end of file (truncated?)")
            done += got

    def close(self) -> None:
        """Close the file descriptor."""
        os.close(self.fd)


class SourcePool:
    """Opens each input file once and closes them all at the end (a context manager)."""

    def __init__(self) -> None:
        self._open: dict[Path, LocalFile] = {}

    def get(self, path: Path) -> LocalFile:
        """The open source for `path`, opening it on first use."""
        if path not in self._open:
            self._open[path] = LocalFile(path)
        return self._open[path]

    def __enter__(self) -> SourcePool:
        return self

    def __exit__(self, *exc: object) -> None:
        for source in self._open.values():
            source.close()
        self._open.clear()
