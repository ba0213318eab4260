"""A tensor's values, sliced chunk by chunk, whatever source its bytes come from.

A local file gives a zero-copy view of the whole tensor over its memory mapping. A source without
a mapping (a Hub file read by HTTP ranges) cannot: a view would hold the whole tensor in private
memory. Its values are read in blocks of at most `BLOCK_BYTES` as the chunks ask for them, so
memory stays bounded by the block, not the tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.core.dtypes import itemsize, torch_dtype
from surgery.engine.reader import TensorInfo
from surgery.engine.source import ByteSource, LocalFile

if TYPE_CHECKING:
    import torch

    from surgery.engine.source import SourcePool

# Bytes read ahead of a chunk from a source without a mapping: large enough that a request's
# latency is paid once per block, small enough to bound memory per tensor being read.
BLOCK_BYTES = 8 * 2**20


class LocalBytes:
    """A tensor's bytes in a local file's mapping; `[start:stop]` (elements) is a zero-copy view."""

    def __init__(self, source: LocalFile, info: TensorInfo) -> None:
        self.view = source.view(info.start, info.nbytes)
        self.itemsize = itemsize(info.dtype)

    def __getitem__(self, key: slice) -> memoryview:
        return self.view[key.start * self.itemsize : key.stop * self.itemsize]


class StreamedBytes:
    """A tensor's bytes read block by block; `[start:stop]` (elements) gives their bytes.

    Slices are expected in increasing order (as blends and drift walk a tensor); any order works,
    at the cost of rereading a block. A slice stays valid after later reads (each block is a new
    buffer).
    """

    def __init__(self, source: ByteSource, info: TensorInfo) -> None:
        self.source, self.info = source, info
        self.itemsize = itemsize(info.dtype)
        self._block = memoryview(b"")
        self._block_start = 0  # element index of the block's first value

    def __getitem__(self, key: slice) -> memoryview:
        start, stop, _ = key.indices(self.info.numel)
        stop = max(start, stop)
        size, first = self.itemsize, self._block_start
        if start < first or (stop - first) * size > len(self._block):
            self._read(start, stop)
            first = start
        return self._block[(start - first) * size : (stop - first) * size]

    def _read(self, start: int, stop: int) -> None:
        per_block = max(stop - start, BLOCK_BYTES // self.itemsize)
        count = min(per_block, self.info.numel - start)
        block = memoryview(bytearray(count * self.itemsize))
        self.source.read_into(self.info.start + start * self.itemsize, block)
        self._block, self._block_start = block, start


def tensor_bytes(source: ByteSource, info: TensorInfo) -> LocalBytes | StreamedBytes:
    """`info`'s bytes, sliced by element: views of a local file's mapping, or blocks read from
    any other source (memory bounded by `BLOCK_BYTES`, not the tensor)."""
    if isinstance(source, LocalFile):
        return LocalBytes(source, info)
    return StreamedBytes(source, info)


def element_bytes(pool: SourcePool, info: TensorInfo) -> object:
    """`info`'s bytes sliced by element, from the pool's sources: `tensor_bytes`, or the bytes
    a gathered tensor makes (`TensorInfo.gathered`)."""
    if info.gathered:
        return info.gathered_bytes(pool)
    return tensor_bytes(pool.get(info.file), info)


class StreamedValues:
    """A tensor's values read block by block, as torch tensors; slice with `values[start:stop]`."""

    def __init__(self, source: ByteSource, info: TensorInfo) -> None:
        self.bytes = StreamedBytes(source, info)
        self.dtype = torch_dtype(info.dtype)

    def __getitem__(self, key: slice) -> torch.Tensor:
        import torch

        raw = self.bytes[key]
        return (
            torch.frombuffer(raw, dtype=self.dtype)
            if len(raw)
            else torch.empty(0, dtype=self.dtype)
        )


def tensor_values(source: ByteSource, info: TensorInfo) -> torch.Tensor | StreamedValues:
    """All of `info`'s values as something to slice by element: a zero-copy tensor over a local
    file's mapping, or a `StreamedValues` for any other source."""
    if isinstance(source, LocalFile):
        import torch

        view = source.view(info.start, info.nbytes)
        return torch.frombuffer(view, dtype=torch_dtype(info.dtype), count=info.numel)
    return StreamedValues(source, info)
