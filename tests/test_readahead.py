"""Read-ahead of sources that are not on disk (surgery.engine.readahead): which spans are
fetched, that several are in flight at once, that memory stays bounded and that every read
returns the source's bytes whatever order it comes in."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from surgery.engine.readahead import ReadAhead, ReadAheadSource, plan_spans
from surgery.engine.reader import TensorInfo

FILE, OTHER = Path("a.safetensors"), Path("b.safetensors")


def info(name: str, start: int, nbytes: int, file: Path = FILE) -> TensorInfo:
    return TensorInfo(name, "U8", (nbytes,), file, start, nbytes)


class Recorder:
    """Bytes in memory that record each read; with `together`, the first reads wait until that
    many are in flight at once (a broken barrier fails the read)."""

    def __init__(self, size: int, together: int = 0) -> None:
        self.data = bytes(i % 251 for i in range(size))
        self.size, self.reads = size, []
        self.barrier = threading.Barrier(together, timeout=10) if together else None
        self.lock = threading.Lock()

    def read_into(self, offset: int, buffer: memoryview) -> None:
        with self.lock:
            self.reads.append((offset, offset + len(buffer)))
            wait = self.barrier is not None and len(self.reads) <= self.barrier.parties
        if wait:
            self.barrier.wait()
        buffer[:] = self.data[offset : offset + len(buffer)]

    def view(self, offset: int, nbytes: int) -> memoryview:
        return memoryview(self.data)[offset : offset + nbytes]

    def close(self) -> None:
        pass


def test_adjacent_tensors_coalesce_and_groups_interleave():
    small = [info(f"n{i}", 100 + 10 * i, 10) for i in range(5)]  # touching: one span
    spans = plan_spans([[t] for t in small], lambda file: True, span=40)
    assert [(s.start, s.stop) for s in spans] == [(100, 140), (140, 150)]  # at most `span`
    pair = [info("a", 0, 100), info("b", 500, 60, OTHER)]
    spans = plan_spans([pair], lambda file: True, span=40)
    assert [(s.file, s.start, s.stop) for s in spans] == [
        (FILE, 0, 40),
        (OTHER, 500, 540),
        (FILE, 40, 80),
        (OTHER, 540, 560),
        (FILE, 80, 100),
    ]
    assert plan_spans([pair], lambda file: file == OTHER, span=40)[0].file == OTHER
    # Pairs read side by side (drift): each file's touching tensors still coalesce.
    pairs = [[info(f"a{i}", 10 * i, 10), info(f"b{i}", 10 * i, 10, OTHER)] for i in range(3)]
    spans = plan_spans(pairs, lambda file: True, span=40)
    assert [(s.file, s.start, s.stop) for s in spans] == [(FILE, 0, 30), (OTHER, 0, 30)]
    assert plan_spans([[info("empty", 7, 0)]], lambda file: True) == []


def test_several_requests_are_in_flight_and_memory_is_bounded():
    source = Recorder(1000, together=4)  # the first 4 requests must be in flight together
    tensors = [[info(f"t{i}", 100 * i, 100)] for i in range(10)]
    ahead = ReadAhead(plan_spans(tensors, lambda f: True, span=100), lambda f: source, depth=4)
    wrapped = ReadAheadSource(source, ahead, FILE)
    try:
        for i in range(10):
            buffer = memoryview(bytearray(100))
            wrapped.read_into(100 * i, buffer)
            assert bytes(buffer) == source.data[100 * i : 100 * (i + 1)]
            assert len(ahead._held) <= 4  # never more than `depth` spans held
    finally:
        ahead.close()
    assert sorted(source.reads) == [(100 * i, 100 * (i + 1)) for i in range(10)]  # each once


@pytest.mark.parametrize("order", ["announced", "reversed", "straddling"])
def test_reads_return_the_sources_bytes_in_any_order(order):
    source = Recorder(4000)
    tensors = [[info(f"t{i}", 300 * i, 300)] for i in range(12)]
    ahead = ReadAhead(plan_spans(tensors, lambda f: True, span=250), lambda f: source, depth=3)
    wrapped = ReadAheadSource(source, ahead, FILE)
    reads = [(300 * i, 300) for i in range(12)]
    if order == "reversed":
        reads.reverse()
    elif order == "straddling":
        reads = [(start, 700) for start in range(0, 3500, 700)] + [(3500, 100)]
    try:
        for start, size in reads:
            assert bytes(wrapped.view(start, size)) == source.data[start : start + size]
        assert ahead._held == []  # every span fetched was read, none holds a slot
    finally:
        ahead.close()
    assert fetched_once(source.reads, 3600)


def fetched_once(reads: list[tuple[int, int]], size: int) -> bool:
    """Whether `reads` cover bytes [0, size) each exactly once."""
    position = 0
    for start, stop in sorted(reads):
        if start != position:
            return False
        position = stop
    return position == size


def test_a_reader_ahead_of_the_window_fetches_its_span_once():
    # One tensor fills the window (a writer thread waits on it); another thread reads the next
    # tensor meanwhile: its span is fetched once, out of turn, not again when the window moves.
    source = Recorder(500)
    tensors = [[info("big", 0, 400)], [info("next", 400, 100)]]
    ahead = ReadAhead(plan_spans(tensors, lambda f: True, span=100), lambda f: source, depth=4)
    wrapped = ReadAheadSource(source, ahead, FILE)
    try:
        assert bytes(wrapped.view(400, 100)) == source.data[400:]
        assert bytes(wrapped.view(0, 400)) == source.data[:400]
        assert ahead._held == []
    finally:
        ahead.close()
    assert fetched_once(source.reads, 500)
