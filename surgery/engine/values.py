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

# Bytes read ahead of a chunk from a source without a mapping: large enough that a request's
# latency is paid once per block, small enough to bound memory per tensor being read.
BLOCK_BYTES = 8 * 2**20


class StreamedValues:
    """A tensor's values read block by block; slice it with `values[start:stop]` (elements).

    Slices are expected in increasing order (as blends and drift walk a tensor); any order works,
    at the cost of rereading a block.
    """

    def __init__(self, source: ByteSource, info: TensorInfo) -> None:
        self.source, self.info = source, info
        self.dtype = torch_dtype(info.dtype)
        self.itemsize = itemsize(info.dtype)
        self._block: torch.Tensor | None = None
        self._block_start = 0  # element index of the block's first value

    def __getitem__(self, key: slice) -> torch.Tensor:
        start, stop, _ = key.indices(self.info.numel)
        stop = max(start, stop)
        block = self._block
        if block is None or start < self._block_start or stop > self._block_start + len(block):
            block = self._read(start, stop)
        return block[start - self._block_start : stop - self._block_start]

    def _read(self, start: int, stop: int) -> torch.Tensor:
        import torch

        per_block = max(stop - start, BLOCK_BYTES // self.itemsize)
        count = min(per_block, self.info.numel - start)
        # A new buffer per block: slices handed out earlier stay valid.
        block = torch.empty(count, dtype=self.dtype)
        raw = memoryview(block.view(torch.uint8).numpy())
        self.source.read_into(self.info.start + start * self.itemsize, raw)
        self._block, self._block_start = block, start
        return block


def tensor_values(source: ByteSource, info: TensorInfo) -> torch.Tensor | StreamedValues:
    """All of `info`'s values as something to slice by element: a zero-copy tensor over a local
    file's mapping, or a `StreamedValues` for any other source."""
    if isinstance(source, LocalFile):
        import torch

        view = source.view(info.start, info.nbytes)
        return torch.frombuffer(view, dtype=torch_dtype(info.dtype), count=info.numel)
    return StreamedValues(source, info)
