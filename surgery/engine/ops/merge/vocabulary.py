"""Merges over vocabularies that differ: each model's embedding and head rows permuted onto the
output vocabulary, as mergekit's `PermutedVocabulary` does, before the merge method blends them.

The vocabulary map is built above the engine, from the tokenizers (`surgery.vocabulary`); the
engine only sees rows: for every model and output row, the input rows it takes (one: a copy;
none: zeros; several: their mean, summed in order and divided once, in the tensor's dtype as
mergekit computes it) or `PAD` (the mean of that model's rows before the padding).
Rows are gathered chunk by chunk as a kernel reads them, so memory stays bounded by chunks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from surgery.engine.float_codec import decode, encode
from surgery.engine.reader import TensorInfo
from surgery.engine.source import SourcePool
from surgery.engine.values import tensor_bytes

# One output row of one model: the (model, input row) pairs it is made of.
Take = tuple[tuple[int, int], ...]
PAD = None  # a padding row: the mean of the model's rows before it


@dataclass(frozen=True)
class VocabularyMap:
    """Where every output row of every model's vocabulary tensors comes from.

    `rows[m][r]` is model m's row r (a `Take`, or `PAD`); `size` output rows in all, of which
    `tokens` are the tokenizer's (the rest padding). `record` is what the recipe says of it.
    """

    rows: tuple[tuple[Take | None, ...], ...]
    size: int
    tokens: int
    record: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class PermutedTensor(TensorInfo):
    """A model's vocabulary tensor laid out on the output vocabulary: its rows gathered from
    `columns` (the same tensor in every model, by model index; None where a model lacks it).

    `file`, `start` and `nbytes` are the model's own tensor's (what read-ahead fetches)."""

    columns: tuple[TensorInfo | None, ...] = ()
    takes: tuple[Take | None, ...] = ()
    gathered: ClassVar[bool] = True

    def gathered_bytes(self, pool: SourcePool) -> PermutedBytes:
        """Its bytes by element, gathered from the columns' as they are read."""
        return PermutedBytes(pool, self)


def is_vocabulary_tensor(tensor: TensorInfo, vocab_rows: int | None) -> bool:
    """Whether `tensor` is indexed by token: a matrix with as many rows as the vocabulary."""
    return vocab_rows is not None and len(tensor.shape) == 2 and tensor.shape[0] == vocab_rows


def common_float(dtypes: set[str]) -> str:
    """The dtype tensors of these dtypes are promoted to (as torch promotes them)."""
    if len(dtypes) == 1:
        return next(iter(dtypes))
    return "F64" if "F64" in dtypes else "F32"


def permuted(
    model: int, columns: Sequence[TensorInfo | None], vocabulary: VocabularyMap, dtype: str
) -> PermutedTensor:
    """Model `model`'s tensor (`columns[model]`) on the output vocabulary, in `dtype`."""
    own = columns[model]
    shape = (vocabulary.size, *own.shape[1:])
    return PermutedTensor(
        own.name,
        dtype,
        shape,
        own.file,
        own.start,
        own.nbytes,
        columns=tuple(columns),
        takes=vocabulary.rows[model],
    )


def _work(dtype: str) -> type[np.floating]:
    return np.float64 if dtype == "F64" else np.float32


class PermutedBytes:
    """A `PermutedTensor`'s bytes, `[start:stop]` by element, gathered row by row on demand."""

    def __init__(self, pool: SourcePool, tensor: PermutedTensor) -> None:
        self.tensor = tensor
        self.width = math.prod(tensor.shape[1:])
        self.work = _work(tensor.dtype)
        self.sources = [
            None if c is None else tensor_bytes(pool.get(c.file), c) for c in tensor.columns
        ]
        self._pad: np.ndarray | None = None

    def __getitem__(self, key: slice) -> memoryview:
        first, last = key.start // self.width, -(-key.stop // self.width)
        rows = np.stack([self._row(r) for r in range(first, last)]).reshape(-1)
        offset = key.start - first * self.width
        data = encode(rows[offset : offset + key.stop - key.start], self.tensor.dtype)
        return memoryview(data).cast("B")

    def _input_row(self, model: int, row: int) -> np.ndarray:
        column = self.tensor.columns[model]
        raw = self.sources[model][row * self.width : (row + 1) * self.width]
        return decode(raw, column.dtype, self.work)

    def _rounded(self, values: np.ndarray) -> np.ndarray:
        """`values` rounded to the tensor's dtype (each step of a mean is, as in torch)."""
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
