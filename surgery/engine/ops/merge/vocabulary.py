"""Merges over vocabularies that differ: each model's embedding and head rows permuted onto the
output vocabulary, as mergekit's `PermutedVocabulary` does, before the merge method blends them.

The vocabulary map is built above the engine, from the tokenizers (`surgery.vocabulary`); the
engine only sees rows: for every model and output row, the input rows it takes (one: a copy;
none: zeros; several: their mean, summed in order and divided once, in the tensor's dtype as
mergekit computes it) or `PAD` (the mean of that model's rows before the padding).
Rows are gathered chunk by chunk as a kernel reads them, so memory stays bounded by chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from surgery.engine.reader import TensorInfo

if TYPE_CHECKING:
    from surgery.engine.ops.merge.permuted_rows import PermutedBytes
    from surgery.engine.source import SourcePool

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
        # numpy only once rows are gathered: a revert imports this module, never numpy.
        from surgery.engine.ops.merge.permuted_rows import PermutedBytes

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
