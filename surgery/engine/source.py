"""Where tensor bytes come from: a small interface, so the engine never cares how bytes arrive.

A local file is memory-mapped: tensor bytes are read straight from the page cache, so they cost
no private memory and no copy. The engine asks a source only for its `size`, `view(offset,
nbytes)` and `read_into(offset, buffer)`, and, for kernel copies, a local file's descriptor.
Other sources (HTTP range reads of Hub files, `surgery.hub.range_source`) implement the
`ByteSource` protocol and reach the engine as openers handed to `SourcePool`; the engine never
imports the code behind them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from surgery.core.errors import CheckpointError
from surgery.engine.readahead import Extent, ReadAhead, ReadAheadSource, plan_spans


class ByteSource(Protocol):
    """Random access to the bytes of one file. Errors are `CheckpointError`s."""

    size: int

    def view(self, offset: int, nbytes: int) -> memoryview:
        """`nbytes` bytes from `offset` (zero-copy where the source allows)."""

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes from `offset`."""

    def close(self) -> None:
        """Release what the source holds."""


# How to open a file that is not on disk: called once per SourcePool that needs it.
Opener = Callable[[], ByteSource]


class LocalFile:
    """A local file opened read-only, memory-mapped for views, `pread` for copies into buffers;
    its descriptor also serves `copy_file_range`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        # A private (copy-on-write) mapping is writable as far as Python's buffer protocol is
        # concerned, which torch.frombuffer wants, yet nothing can ever reach the file: inputs
        # are never modified. Pages we only read stay shared page cache, not private memory.
        self._map = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_COPY) if self.size else None

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Zero-copy bytes of the mapped file; past the end is a truncated checkpoint."""
        if offset + nbytes > self.size or self._map is None:
            raise CheckpointError(f"{self.path}: unexpected end of file (truncated?)")
        return memoryview(self._map)[offset : offset + nbytes]

    def will_need(self, offset: int, nbytes: int) -> None:
        """Have the kernel start reading these bytes into the page cache now, in the background:
        a blend faulting through a cold mapping would otherwise wait on each small read-ahead.
        Costs a page-cache lookup per page when they are already there."""
        if self._map is None or nbytes <= 0:
            return
        start = offset - offset % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):  # only advice
            self._map.madvise(mmap.MADV_WILLNEED, start, min(offset + nbytes, self.size) - start)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` from `offset`; a short file is a truncated checkpoint."""
        done = 0
        while done < len(buffer):
            got = os.preadv(self.fd, [buffer[done:]], offset + done)
            if got == 0:
                raise CheckpointError(f"{self.path}: unexpected end of file (truncated?)")
            done += got

    def close(self) -> None:
        """Unmap and close the file."""
        if self._map is not None:
            # A tensor may still view the mapping; it is then unmapped when that is freed.
            with contextlib.suppress(BufferError):
                self._map.close()
        os.close(self.fd)


class SourcePool:
    """Opens each input file once and closes them all at the end (a context manager).

    Args:
        openers: for files that are not on disk (Hub files read by ranges), how to open them;
            every other path is opened as a `LocalFile`.
    """

    def __init__(self, openers: Mapping[Path, Opener] | None = None) -> None:
        self._openers = dict(openers or {})
        self._open: dict[Path, ByteSource] = {}
        self._ahead: ReadAhead | None = None
        self._wrapped: dict[Path, ByteSource] = {}  # remote files read through `_ahead`
        self._lock = threading.Lock()  # writer threads share the pool

    def expect(self, groups: Iterable[Sequence[Extent]]) -> None:
        """Announce the tensors the command reads, in order, as groups read side by side, so
        that files not on disk are fetched ahead, several requests at once
        (`surgery.engine.readahead`). Local files need none of it: the page cache reads
        ahead. Call it before the first `get`."""
        spans = plan_spans(groups, lambda path: path in self._openers)
        if spans:
            self._ahead = ReadAhead(spans, self._source)

    def get(self, path: Path) -> ByteSource:
        """The open source for `path`, opening it on first use."""
        source = self._source(path)
        if self._ahead is None or path not in self._openers:
            return source
        with self._lock:
            if path not in self._wrapped:
                self._wrapped[path] = ReadAheadSource(source, self._ahead, path)
            return self._wrapped[path]

    def _source(self, path: Path) -> ByteSource:
        with self._lock:
            if path not in self._open:
                opener = self._openers.get(path)
                self._open[path] = opener() if opener is not None else LocalFile(path)
            return self._open[path]

    def __enter__(self) -> SourcePool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        for source in self._open.values():
            source.close()
        self._open.clear()
        self._wrapped.clear()
