"""Tensor chunks as numpy arrays for the merge kernels (decoded and encoded by
`surgery.engine.float_codec`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from functools import partial

import numpy as np

from surgery.core.dtypes import itemsize
from surgery.engine.blend import encode_checked
from surgery.engine.float_codec import (
    CODEC_DTYPES,
    decode,
    decode_into,
    decode_split_into,
    encode_split,
    may_overflow,
)
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.reader import TensorInfo
from surgery.engine.shard_hash import OrderedHash
from surgery.engine.source import SourcePool
from surgery.engine.values import LocalBytes, element_bytes

# Elements per chunk: the writer's blend chunk (surgery/engine/writer.py CHUNK_ELEMENTS).
CHUNK_ELEMENTS = 2**17


def work_dtype(dtypes: Sequence[str]) -> type[np.floating]:
    """float32 for 16- and 32-bit floats, float64 when any tensor involved is float64."""
    for dtype in dtypes:
        if dtype not in CODEC_DTYPES:
            raise MergeConfigError(f"merge methods support F64, F32, F16 and BF16, not {dtype}")
    return np.float64 if "F64" in dtypes else np.float32


class Inputs:
    """The source tensors of one output tensor, read chunk by chunk as `work` floats."""

    def __init__(self, pool: SourcePool, tensors: Sequence[TensorInfo], work: type) -> None:
        self.tensors = list(tensors)
        self.work = work
        self.bytes = [element_bytes(pool, t) for t in self.tensors]
        self.numel = self.tensors[0].numel

    def chunk(self, index: int, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of input `index`."""
        return decode(self.bytes[index][start:stop], self.tensors[index].dtype, self.work)

    def chunk_into(self, index: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements [start, stop) of input `index`, decoded into `out` (as long)."""
        return decode_into(self.bytes[index][start:stop], self.tensors[index].dtype, out)

    def splits(self, count: int) -> bool:
        """Whether a chunk of `count` elements of every input can be decoded in split order
        (`chunk_split_into`): all bf16, read as float32, an even count."""
        return (
            self.work is np.float32
            and count % 2 == 0
            and all(t.dtype == "BF16" for t in self.tensors)
        )

    def chunk_split_into(self, index: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements [start, stop) of bf16 input `index` decoded into float32 `out` in split
        order (`decode_split_into`: the even-numbered elements, then the odd-numbered ones),
        for elementwise work: half the passes of `chunk_into`."""
        return decode_split_into(self.bytes[index][start:stop], out)

    def all(self, start: int, stop: int) -> list[np.ndarray]:
        """Elements [start, stop) of every input."""
        return [self.chunk(i, start, stop) for i in range(len(self.tensors))]

    def gather(self, index: int, positions: np.ndarray) -> np.ndarray | None:
        """The elements of input `index` at `positions`, or None where its bytes are not mapped
        (a Hub file read by ranges: scattered reads would each be a request)."""
        data = self.bytes[index]
        if not isinstance(data, LocalBytes):
            return None
        raw = np.frombuffer(data.view, f"u{data.itemsize}")[positions]
        return decode(memoryview(raw).cast("B"), self.tensors[index].dtype, self.work)

    def chunks(
        self, step: int = CHUNK_ELEMENTS, part: range | None = None, *, reuse: bool = False
    ) -> Iterator[tuple[int, list[np.ndarray]]]:
        """(start, one array per input) over `part` (default: the whole tensor), `step`
        elements at a time.

        Args:
            reuse: decode every chunk into the same arrays, for a caller that keeps nothing of
                a chunk once it asks for the next (a reduction pass): no allocation per chunk.
        """
        part = range(self.numel) if part is None else part
        size = min(step, len(part))
        buffers = [np.empty(size, self.work) for _ in self.tensors] if reuse else None
        for start in range(part.start, part.stop, step):
            stop = min(start + step, part.stop)
            if buffers is None:
                yield start, self.all(start, stop)
                continue
            yield (
                start,
                [
                    decode_into(self.bytes[i][start:stop], t.dtype, buffer[: stop - start])
                    for i, (t, buffer) in enumerate(zip(self.tensors, buffers, strict=True))
                ],
            )


class Scratch:
    """Arrays one pass reuses from chunk to chunk, by name and dtype, `size` elements each.

    A chunk's temporaries allocated anew cost more than the arithmetic on them: each is a fresh
    mapping from the system, page-faulted in and given back (measured 0.6 ns per element per
    array). One pass of one job owns its scratch; jobs never share one.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.arrays: dict[tuple[str, np.dtype], np.ndarray] = {}

    def get(self, name: str, dtype: type, count: int) -> np.ndarray:
        """The first `count` elements of the array called `name` (contents left over)."""
        key = (name, np.dtype(dtype))
        array = self.arrays.get(key)
        if array is None:
            array = self.arrays[key] = np.empty(self.size, dtype)
        return array[:count]


class Output:
    """Writes chunks of one output tensor (`name`, `dtype`) at its place in an open shard."""

    def __init__(
        self,
        fd: int,
        offset: int,
        name: str,
        dtype: str,
        inputs: Inputs,
        progress: object,
        hasher: OrderedHash,
    ) -> None:
        self.fd, self.offset, self.name, self.dtype = fd, offset, name, dtype
        self.inputs, self.progress, self.hasher = inputs, progress, hasher

    def put(self, start: int, values: np.ndarray) -> None:
        """Round `values` once to the output dtype and write them at element `start`.

        Raises:
            SurgeryError: the rounding overflows (inf or NaN from finite inputs), as a blend's.
        """
        stop = start + len(values)
        self._write(start, encode_checked(self, values, partial(self.inputs.all, start, stop)))

    def put_split(self, start: int, values: np.ndarray, scratch: np.ndarray) -> bool:
        """Round float32 `values`, in split order (`Inputs.chunk_split_into`), once to bf16 and
        write them at element `start`, in order; `scratch`: a float32 array as long. False,
        writing nothing, where a value might round to inf or NaN: the caller then puts the
        chunk in plain order, where `put` checks it."""
        if may_overflow(values, self.dtype):
            return False
        self._write(start, encode_split(values, scratch))
        return True

    def _write(self, start: int, rounded: np.ndarray) -> None:
        data = memoryview(rounded).cast("B")
        position = self.offset + start * itemsize(self.dtype)
        self.hasher.add(position, data)  # copied if early: bounded by the hash's pending limit
        total = len(data)
        while len(data):
            written = os.pwrite(self.fd, data, position)
            data, position = data[written:], position + written
        self.progress.update(total)
