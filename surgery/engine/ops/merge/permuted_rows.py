"""The rows of a `PermutedTensor` (`surgery.engine.ops.merge.vocabulary`), gathered as a
kernel or a blend reads them: copies, zeros, means in the tensor's dtype, padding."""

from __future__ import annotations

import math

import numpy as np

from surgery.core.dtypes import itemsize
from surgery.engine.float_codec import decode, encode
from surgery.engine.reader import TensorInfo
from surgery.engine.source import SourcePool
from surgery.engine.values import tensor_bytes

# `vocabulary.PAD` (not imported: that module imports this one when rows are gathered).
PAD = None


def _work(dtype: str) -> type[np.floating]:
    return np.float64 if dtype == "F64" else np.float32


class PermutedBytes:
    """A `PermutedTensor`'s bytes, `[start:stop]` by element, gathered row by row on demand."""

    def __init__(self, pool: SourcePool, tensor: TensorInfo) -> None:
        self.tensor = tensor
        self.width = math.prod(tensor.shape[1:])
        self.work = _work(tensor.dtype)
        self.sources = [
            None if c is None else tensor_bytes(pool.get(c.file), c) for c in tensor.columns
        ]
        self._pad: np.ndarray | None = None

    def __getitem__(self, key: slice) -> memoryview:
        first, last = key.start // self.width, -(-key.stop // self.width)
        size = itemsize(self.tensor.dtype)
        row_bytes = self.width * size
        out = bytearray((last - first) * row_bytes)
        row = first
        while row < last:
            at = (row - first) * row_bytes
            run = self._copied_run(row, last)
            if run:  # consecutive rows of one input, copied as one slice
                model, source_row = self.tensor.takes[row][0]
                source = self.sources[model][
                    source_row * self.width : (source_row + run) * self.width
                ]
                out[at : at + run * row_bytes] = source
                row += run
            else:
                out[at : at + row_bytes] = self._row_bytes(row)
                row += 1
        offset = (key.start - first * self.width) * size
        return memoryview(out)[offset : offset + (key.stop - key.start) * size]

    def _copied_run(self, row: int, last: int) -> int:
        """How many rows from `row` (before `last`) are copies of consecutive rows of one input
        of the tensor's dtype; 0 when `row` is not such a copy."""
        takes, run = self.tensor.takes, 0
        first = takes[row]
        if first is PAD or len(first) != 1:
            return 0
        model, source_row = first[0]
        if self.tensor.columns[model].dtype != self.tensor.dtype:
            return 0
        while row + run < last and takes[row + run] == ((model, source_row + run),):
            run += 1
        return run

    def _row_bytes(self, row: int) -> memoryview:
        """Row `row`'s bytes: a copy of an input row of the tensor's dtype as it is, any other
        row computed and rounded to it."""
        take = self.tensor.takes[row]
        if take is not PAD and len(take) == 1:
            model, source_row = take[0]
            if self.tensor.columns[model].dtype == self.tensor.dtype:
                return self.sources[model][source_row * self.width : (source_row + 1) * self.width]
        return memoryview(encode(self._row(row), self.tensor.dtype)).cast("B")

    def _input_row(self, model: int, row: int) -> np.ndarray:
        column = self.tensor.columns[model]
        raw = self.sources[model][row * self.width : (row + 1) * self.width]
        return decode(raw, column.dtype, self.work)

    def _rounded(self, values: np.ndarray) -> np.ndarray:
        """`values` rounded to the tensor's dtype (each step of a mean is, as in torch)."""
        if self.tensor.dtype in ("F32", "F64") and values.dtype == self.work:
            return values  # the work dtype is the tensor's: nothing to round
        return decode(
            memoryview(encode(values, self.tensor.dtype)).cast("B"), self.tensor.dtype, self.work
        )

    def _row(self, row: int) -> np.ndarray:
        take = self.tensor.takes[row]
        if take is PAD:
            return self._padding()
        if not take:
            return np.zeros(self.width, self.work)
        if len(take) == 1:
            return self._rounded(self._input_row(*take[0]))
        total = np.zeros(self.width, self.work)
        for model, source_row in take:
            total = self._rounded(total + self._rounded(self._input_row(model, source_row)))
        return self._rounded(total / self.work(len(take)))

    def _padding(self) -> np.ndarray:
        """The mean of the rows before the padding (computed once, in float64)."""
        if self._pad is None:
            count = sum(t is not PAD for t in self.tensor.takes)
            total = np.zeros(self.width, np.float64)
            for row in range(count):
                total += self._row(row)
            self._pad = self._rounded((total / count).astype(self.work))
        return self._pad
