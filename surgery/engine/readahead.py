"""Read-ahead for sources that are not on disk (Hub files read by ranges): keep the link full.

A command that knows what it will read (the writer, drift) announces it, in order, to its
`SourcePool` as groups of tensors read side by side (a copy's one source, a blend's sources, a
pair drift compares). The announced bytes are cut into spans of at most `SPAN_BYTES`, the
spans of a group interleaved as the group is read, and spans that continue a recent one in the
same file coalesced into it: adjacent small tensors (norms, biases) cost one request, not one
each. Up to `DEPTH` spans are fetched or held at once, each by its own request on a worker
thread, so several requests are in flight and memory stays bounded (`DEPTH * SPAN_BYTES`).
A span is dropped once all its bytes were read and the next one starts. A read of a span the
window has not reached yet (a writer thread ahead of another that waits on a large tensor)
starts that span at once, out of turn, so its bytes are still fetched once, not once directly
and again when the window gets there (a span nobody reads again would hold its slot for good);
the window then holds at most `DEPTH` spans plus one per reader. A read of no announced span
left (a second pass) is fetched directly, as without read-ahead: read-ahead changes how fast,
never which bytes a read returns.
"""

from __future__ import annotations

import bisect
import mmap
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Bytes per request: large enough that a round trip is a small share of its transfer time at
# the Hub's usual bandwidth, small enough that `DEPTH` of them are a bounded buffer.
SPAN_BYTES = 8 * 2**20
# Requests in flight (or fetched and waiting to be read) at once.
DEPTH = 8
# How far back a span may grow by the bytes that continue it.
COALESCE_BACK = 4
# Spans of a file starting at or before a read's offset that are checked for one not started
# (announced twice, spans may overlap; past these the read is fetched directly).
_LOOK_BACK = 4


class Extent(Protocol):
    """Where a tensor's bytes lie (a `TensorInfo` is one)."""

    file: Path
    start: int
    nbytes: int


class Readable(Protocol):
    """What a span is fetched from (a `ByteSource` is one)."""

    size: int

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes from `offset`."""


@dataclass
class _Span:
    """Bytes [start, stop) of one file, fetched ahead of the reads that use them."""

    file: Path
    start: int
    stop: int
    future: Future | None = None
    read: int = 0  # bytes handed out so far
    data: mmap.mmap | bytearray = field(default_factory=bytearray, repr=False)


def plan_spans(
    groups: Iterable[Sequence[Extent]], remote: Callable[[Path], bool], span: int = SPAN_BYTES
) -> list[_Span]:
    """The spans to fetch for `groups`, in read order: each group's tensors (in files for which
    `remote` is true) cut into pieces of `span` bytes, interleaved, then coalesced."""
    spans: list[_Span] = []
    for group in groups:
        pieces = [
            [
                (t.file, start, min(start + span, t.start + t.nbytes))
                for start in range(t.start, t.start + t.nbytes, span)
            ]
            for t in group
            if t.nbytes and remote(t.file)
        ]
        for row in range(max(map(len, pieces), default=0)):
            for piece in pieces:
                if row < len(piece):
                    _append(spans, *piece[row], span)
    return spans


def _append(spans: list[_Span], file: Path, start: int, stop: int, span: int) -> None:
    """Add bytes [start, stop) of `file`, into a recent span of that file they continue (one of
    the last `COALESCE_BACK`: a group's other files come in between, as drift's pairs do)."""
    for last in reversed(spans[-COALESCE_BACK:]):
        if last.file == file:
            if last.stop == start and stop - last.start <= span:
                last.stop = stop
                return
            break
    spans.append(_Span(file, start, stop))


class ReadAhead:
    """Fetches announced spans ahead of the reads, `depth` requests at a time.

    Args:
        spans: what will be read, in order (`plan_spans`).
        source: the source of a file (not wrapped: what the span's request reads from).
        depth: spans fetched or held at once.
    """

    def __init__(
        self, spans: list[_Span], source: Callable[[Path], Readable], depth: int = DEPTH
    ) -> None:
        self._spans = spans
        self._source = source
        self._depth = depth
        self._next = 0  # the first span not started in turn yet (later ones may be, out of turn)
        self._held: list[_Span] = []  # started, not all read, in read order
        self._by_file: dict[Path, list[_Span]] = {}  # each file's spans by start, for lookups
        for span in sorted(spans, key=lambda s: s.start):
            self._by_file.setdefault(span.file, []).append(span)
        self._starts = {f: [s.start for s in ordered] for f, ordered in self._by_file.items()}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(depth, thread_name_prefix="read-ahead")
        with self._lock:
            self._fill()

    def read_into(self, file: Path, offset: int, buffer: memoryview) -> int:
        """Copy the bytes from `offset` of `file` the window holds into the start of `buffer`.

        Returns:
            How many bytes were copied (0 when the window does not hold those at `offset`).

        Raises:
            CheckpointError: the span's request failed (the source's own error).
        """
        done = 0
        while done < len(buffer):
            with self._lock:
                span, early = self._held_at(file, offset + done), None
                if span is None:
                    span = early = self._claim_early(file, offset + done)
                data = None if span is None else span.data  # kept even if the span is freed
            if span is None:
                break
            if early is not None:
                self._fetch_here(early)
            span.future.result()  # waits for its request; re-raises its error
            at = offset + done - span.start
            take = min(len(buffer) - done, span.stop - span.start - at)
            with memoryview(data) as held:  # sliced without a copy
                buffer[done : done + take] = held[at : at + take]
            done += take
            self._consumed(span, take)
        return done

    def close(self) -> None:
        """Stop fetching: spans not started are cancelled, those in flight finish."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._held.clear()

    def _held_at(self, file: Path, offset: int) -> _Span | None:
        """The held span with the byte at `offset` of `file` (called with the lock held)."""
        return next((s for s in self._held if s.file == file and s.start <= offset < s.stop), None)

    def _claim_early(self, file: Path, offset: int) -> _Span | None:
        """Claim, out of turn, the announced span with the byte at `offset` that the window has
        not started yet, for the reader to fetch itself (`_fetch_here`: the window's requests
        may all be busy); None when there is none (called with the lock held)."""
        spans = self._by_file.get(file, [])
        at = bisect.bisect_right(self._starts.get(file, []), offset)
        for span in reversed(spans[max(0, at - _LOOK_BACK) : at]):
            if span.future is None and offset < span.stop:
                self._hold(span)
                span.future = Future()
                return span
        return None

    def _fetch_here(self, span: _Span) -> None:
        """Fetch a span claimed out of turn in the calling thread; other readers of it wait on
        its future, which carries the error if the request fails."""
        try:
            self._fetch(span)
        except BaseException as error:
            span.future.set_exception(error)
        else:
            span.future.set_result(None)

    def _consumed(self, span: _Span, nbytes: int) -> None:
        with self._lock:
            span.read += nbytes
            if span.read >= span.stop - span.start and span in self._held:
                self._held.remove(span)
                span.data = bytearray()  # freed now, whoever still holds the span
                self._fill()

    def _fill(self) -> None:
        """Start spans until `depth` are held (called with the lock held)."""
        while len(self._held) < self._depth and self._next < len(self._spans):
            span = self._spans[self._next]
            self._next += 1
            if span.future is None:  # not started out of turn already
                self._hold(span)
                span.future = self._pool.submit(self._fetch, span)

    def _hold(self, span: _Span) -> None:
        """Give `span` a buffer of its own (before its request starts) and hold it."""
        span.data = _buffer(span.stop - span.start)
        self._held.append(span)

    def _fetch(self, span: _Span) -> None:
        self._source(span.file).read_into(span.start, memoryview(span.data))


def _buffer(nbytes: int) -> mmap.mmap:
    """Memory for one span: mapped for it alone, so that it goes back to the system the moment
    the span is dropped. From malloc, spans freed by one thread and allocated by another pile
    up in glibc's per-thread arenas (the writer also raises its mmap threshold above a span),
    and the process keeps far more than the window holds."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class ReadAheadSource:
    """A source whose reads are served from the window where it holds them, from the source
    itself otherwise (a `ByteSource`, as the source it wraps)."""

    def __init__(self, source: Readable, ahead: ReadAhead, file: Path) -> None:
        self.source, self.ahead, self.file = source, ahead, file
        self.size = source.size

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The bytes, copied into private memory (as a remote source's `view`)."""
        buffer = memoryview(bytearray(nbytes))
        self.read_into(offset, buffer)
        return buffer

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` from `offset`: the window's bytes first, then the source's."""
        done = 0
        while done < len(buffer):
            got = self.ahead.read_into(self.file, offset + done, buffer[done:])
            if got == 0:
                # Not held here: read directly up to where a held span might start again.
                self.source.read_into(offset + done, buffer[done:])
                return
            done += got

    def close(self) -> None:
        """The wrapped source is closed by its pool."""
