"""The rows of a `PermutedTensor` (`surgery.engine.ops.merge.vocabulary`), gathered as a
kernel or a blend reads them: copies, zeros, means in the tensor's dtype, padding.

A chunk's copied rows are byte copies, consecutive ones as one slice. Its other rows are
computed together: each input's rows are gathered at once (one fancy index over a local file's
mapping) and each step of a mean is one array operation over every row that has the step, in
the order and with the roundings of the one-row-at-a-time mean, so the bytes do not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from surgery.core.dtypes import itemsize
from surgery.engine.float_codec import decode, encode
from surgery.engine.reader import TensorInfo
from surgery.engine.source import SourcePool
from surgery.engine.values import LocalBytes, tensor_bytes

# `vocabulary.PAD` (not imported: that module imports this one when rows are gathered).
PAD = None


def _work(dtype: str) -> type[np.floating]:
    return np.float64 if dtype == "F64" else np.float32


class PermutedBytes:
    """A `PermutedTensor`'s bytes, `[start:stop]` by element, gathered chunk by chunk."""

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
        row_bytes = self.width * itemsize(self.tensor.dtype)
        out = bytearray((last - first) * row_bytes)
        computed = []  # rows that are no byte copy, computed together below
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
                computed.append(row)
                row += 1
        if computed:
            values = self._rows(computed).reshape(-1)  # `encode` takes a flat array
            encoded = encode(values, self.tensor.dtype).reshape(len(computed), -1)
            for row, values in zip(computed, encoded, strict=True):
                at = (row - first) * row_bytes
                out[at : at + row_bytes] = values.tobytes()
        offset = (key.start - first * self.width) * itemsize(self.tensor.dtype)
        size = (key.stop - key.start) * itemsize(self.tensor.dtype)
        return memoryview(out)[offset : offset + size]

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

    def _gather(self, model: int, rows: Sequence[int]) -> np.ndarray:
        """Input `model`'s rows `rows`, decoded to the work dtype, one row per line: one fancy
        index over a local mapping; a streamed source's rows are joined first."""
        column, source = self.tensor.columns[model], self.sources[model]
        row_bytes = self.width * itemsize(column.dtype)
        if isinstance(source, LocalBytes):
            whole = np.frombuffer(source[0 : column.shape[0] * self.width], np.uint8)
            raw = whole.reshape(-1, row_bytes)[np.asarray(rows, np.intp)]
        else:
            w = self.width
            raw = np.frombuffer(b"".join(source[r * w : (r + 1) * w] for r in rows), np.uint8)
        return decode(memoryview(raw).cast("B"), column.dtype, self.work).reshape(len(rows), -1)

    def _rounded(self, values: np.ndarray) -> np.ndarray:
        """`values` rounded to the tensor's dtype (each step of a mean is, as in torch)."""
        if self.tensor.dtype in ("F32", "F64") and values.dtype == self.work:
            return values  # the work dtype is the tensor's: nothing to round
        bits = memoryview(encode(values.reshape(-1), self.tensor.dtype)).cast("B")
        return decode(bits, self.tensor.dtype, self.work).reshape(values.shape)

    def _rows(self, rows: Sequence[int]) -> np.ndarray:
        """The values of output rows `rows` (none a plain copy), one row per line: zeros, an
        input row rounded to the tensor's dtype, padding, or a mean, whose every step is one
        operation per input over all the rows that take that step."""
        takes = [self.tensor.takes[row] for row in rows]
        values = np.zeros((len(rows), self.width), self.work)
        if any(take is PAD for take in takes):
            values[[i for i, take in enumerate(takes) if take is PAD]] = self._padding()
        single = [i for i, take in enumerate(takes) if take is not PAD and len(take) == 1]
        for model, lines in _by_model(takes, single, 0).items():
            picked = [takes[i][0][1] for i in lines]
            values[lines] = self._rounded(self._gather(model, picked))
        means = [i for i, take in enumerate(takes) if take is not PAD and len(take) > 1]
        if not means:
            return values
        # Summed in the take's order from zeros, rounded at each step, divided once: as the
        # mean of one row is computed (a -0.0 row becomes +0.0, as it does there).
        steps = max(len(takes[i]) for i in means)
        for step in range(steps):
            for model, lines in _by_model(takes, means, step).items():
                picked = [takes[i][step][1] for i in lines]
                added = self._rounded(self._gather(model, picked))
                values[lines] = self._rounded(values[lines] + added)
        counts = np.array([len(takes[i]) for i in means], self.work)[:, None]
        values[means] = self._rounded(values[means] / counts)
        return values

    def _padding(self) -> np.ndarray:
        """The mean of the rows before the padding (computed once, in float64, row by row)."""
        if self._pad is None:
            count = sum(t is not PAD for t in self.tensor.takes)
            total = np.zeros(self.width, np.float64)
            block = max(1, 2**22 // max(1, self.width))  # rows computed at a time (16 MiB)
            for start in range(0, count, block):
                for values in self._rows(range(start, min(count, start + block))):
                    total += values
            self._pad = self._rounded((total / count).astype(self.work))
        return self._pad


def _by_model(takes: Sequence, lines: Sequence[int], step: int) -> dict[int, list[int]]:
    """The `lines` whose take has a step `step`, grouped by the model that step reads."""
    groups: dict[int, list[int]] = {}
    for line in lines:
        if step < len(takes[line]):
            groups.setdefault(takes[line][step][0], []).append(line)
    return groups
