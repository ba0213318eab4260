"""Tensor chunks as numpy arrays: decode from safetensors bytes, encode with one rounding.

numpy has no bfloat16, so bf16 is decoded by a shift (exact) and encoded by round-to-nearest-even
on the float32 bit pattern, as torch rounds. float64 work values bound for bf16 go through float32
first, as torch converts them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from surgery.core.dtypes import itemsize
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.reader import TensorInfo
from surgery.engine.shard_hash import OrderedHash
from surgery.engine.source import SourcePool

# Elements per chunk: the writer's blend chunk (surgery/engine/writer.py CHUNK_ELEMENTS).
CHUNK_ELEMENTS = 2**17

_NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


def work_dtype(dtypes: Sequence[str]) -> type[np.floating]:
    """float32 for 16- and 32-bit floats, float64 when any tensor involved is float64."""
    for dtype in dtypes:
        if dtype not in (*_NUMPY, "BF16"):
            raise MergeConfigError(f"merge methods support F64, F32, F16 and BF16, not {dtype}")
    return np.float64 if "F64" in dtypes else np.float32


def decode(raw: memoryview, dtype: str, start: int, stop: int, work: type) -> np.ndarray:
    """Elements [start, stop) of a tensor's bytes `raw`, as `work` floats (a new array)."""
    size = itemsize(dtype)
    part = raw[start * size : stop * size]
    if dtype == "BF16":
        values = (np.frombuffer(part, np.uint16).astype(np.uint32) << 16).view(np.float32)
        return values if work is np.float32 else values.astype(work)
    return np.frombuffer(part, _NUMPY[dtype]).astype(work)


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` rounded once to `dtype` (round to nearest even), as an array of its bytes."""
    if dtype != "BF16":
        return values.astype(_NUMPY[dtype])
    bits = values.astype(np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


class Inputs:
    """The source tensors of one output tensor, read chunk by chunk as `work` floats."""

    def __init__(self, pool: SourcePool, tensors: Sequence[TensorInfo], work: type) -> None:
        self.tensors = list(tensors)
        self.work = work
        self.views = [pool.get(t.file).view(t.start, t.nbytes) for t in self.tensors]
        self.numel = self.tensors[0].numel

    def chunk(self, index: int, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of input `index`."""
        return decode(self.views[index], self.tensors[index].dtype, start, stop, self.work)

    def chunks(self, step: int = CHUNK_ELEMENTS) -> Iterator[tuple[int, list[np.ndarray]]]:
        """(start, one array per input) over the whole tensor, `step` elements at a time."""
        for start in range(0, self.numel, step):
            stop = min(start + step, self.numel)
            yield start, [self.chunk(i, start, stop) for i in range(len(self.tensors))]


class Output:
    """Writes chunks of one output tensor at its place in an open shard."""

    def __init__(
        self, fd: int, offset: int, dtype: str, progress: object, hasher: OrderedHash
    ) -> None:
        self.fd, self.offset, self.dtype, self.progress = fd, offset, dtype, progress
        self.hasher = hasher

    def put(self, start: int, values: np.ndarray) -> None:
        """Round `values` once to the output dtype and write them at element `start`."""
        data = memoryview(encode(values, self.dtype)).cast("B")
        position = self.offset + start * itemsize(self.dtype)
        self.hasher.add(position, data)  # copied if early: bounded by the hash's pending limit
        total = len(data)
        while len(data):
            written = os.pwrite(self.fd, data, position)
            data, position = data[written:], position + written
        self.progress.update(total)
