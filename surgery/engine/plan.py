"""Plans: for every output tensor, its sources and how they combine. Validated before any write.

An operation (revert, soup, interpolate) only builds a `Plan`; reading, chunking, writing,
checking and progress are shared by all of them (surgery/writer.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from surgery.core.dtypes import nbytes, torch_dtype
from surgery.core.errors import MismatchError
from surgery.engine.matching import match
from surgery.engine.reader import Checkpoint, TensorInfo
from surgery.engine.source import SourcePool

if TYPE_CHECKING:
    import torch

# Bytes compared at a time when checking that non-float tensors agree.
_COMPARE_CHUNK = 8 * 2**20


@dataclass(frozen=True)
class Source:
    """One input tensor and its weight in the output."""

    tensor: TensorInfo
    weight: float = 1.0


@dataclass(frozen=True)
class OutputTensor:
    """One output tensor: sum(weight * source) / divisor, rounded once to `dtype`, or `values`
    held in memory (then `sources` is empty), rounded once to `dtype` as they are written.

    A single source of weight 1 in the output's dtype is a byte copy: no decode, no round trip.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    sources: tuple[Source, ...]
    divisor: float = 1.0
    # A merge kernel (surgery/engine/ops/merge/kernel.py) that computes the tensor in chunked
    # passes; None for copies and weighted sums.
    kernel: Any = field(default=None, compare=False)
    values: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # Output tensors written back to back that make this one, each a copy or a blend of some
    # of its rows (a grown vocabulary: the rows both inputs have blended, the added rows
    # copied); then `sources` is empty.
    pieces: tuple[OutputTensor, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the output tensor."""
        return nbytes(self.dtype, math.prod(self.shape))

    @property
    def is_copy(self) -> bool:
        """Whether this tensor is written as a byte copy of its only source."""
        if self.values is not None or self.pieces:
            return False
        (first, *rest) = self.sources
        return (
            not rest
            and self.kernel is None
            and first.weight == 1.0
            and self.divisor == 1.0
            and first.tensor.dtype == self.dtype
            and not first.tensor.gathered
        )

    def segments(self) -> list[tuple[OutputTensor, int]]:
        """What the writer writes: (tensor, byte offset within this one), its pieces or itself."""
        if not self.pieces:
            return [(self, 0)]
        offsets = itertools.accumulate((p.nbytes for p in self.pieces), initial=0)
        return list(zip(self.pieces, offsets, strict=False))


@dataclass
class Plan:
    """Everything the writer needs: tensors in output order, the recipe, and where small files
    (config, tokenizer) come from."""

    operation: str
    tensors: list[OutputTensor]
    recipe: dict
    files_from: Checkpoint
    inputs: list[Checkpoint] = field(default_factory=list)
    dtype: str | None = None  # the --dtype override, if any (config.json is patched to match)
    config_updates: dict = field(default_factory=dict)  # other config.json keys to set
    mergekit_config: dict | None = None  # the equivalent mergekit YAML config, if there is one
    # Shard file name -> names of the tensors it holds (an input's own layout, kept as it is);
    # None: shards split by size under Hugging Face's names.
    shards: Mapping[str, Sequence[str]] | None = None
    # A PEFT adapter's config (adapter_config.json) when the output is an adapter, not a model:
    # then no index and no config or tokenizer files are written beside its weights.
    adapter: dict | None = None
    # Names of the tensors of each of an input's shards: a grouping the output keeps (under
    # Hugging Face's names) when every group fits the largest shard size, as a revert keeps
    # TRAINED's, like `cp -r`; shards are hashed side by side, one hash per core. None: split by
    # size.
    shard_groups: Sequence[Sequence[str]] | None = None
    # Companion files not copied from `files_from` (a merge that writes a tokenizer of its own
    # leaves out the donor's tokenizer files).
    omit_files: frozenset[str] = frozenset()

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data the output will hold."""
        return sum(t.nbytes for t in self.tensors)


def trained_plan(
    operation: str,
    tensors: list[OutputTensor],
    recipe: dict,
    base: Checkpoint,
    trained: Checkpoint,
    dtype: str | None,
    mergekit_config: Callable[[], dict] | None,
    **layout: Any,
) -> Plan:
    """The plan of an operation that rewrites TRAINED against BASE (revert, interpolate): its
    small files come from TRAINED, both are inputs.

    Args:
        operation, tensors, recipe, dtype: as `Plan` holds them.
        base, trained: the two inputs.
        mergekit_config: makes the equivalent mergekit config; None where mergekit would not
            pair the tensors (it matches them by name and shape, so only an exact matching).
        layout: `Plan`'s other fields (revert keeps TRAINED's shard grouping).
    """
    return Plan(
        operation,
        tensors,
        recipe,
        files_from=trained,
        inputs=[base, trained],
        dtype=dtype,
        mergekit_config=mergekit_config() if mergekit_config is not None else None,
        **layout,
    )


def copy_of(
    tensor: TensorInfo, dtype: str | None = None, *, name: str | None = None
) -> OutputTensor:
    """An output tensor taken whole from `tensor`, cast to `dtype` if it is given and differs,
    named `name` (default: the tensor's own name)."""
    out_dtype = dtype if (dtype and tensor.is_float) else tensor.dtype
    return OutputTensor(name or tensor.name, out_dtype, tensor.shape, (Source(tensor),))


def from_memory(name: str, values: torch.Tensor, dtype: str) -> OutputTensor:
    """An output tensor written from a tensor held in memory, rounded once to `dtype`.

    Args:
        name: the output tensor's name.
        values: any torch tensor of the output's shape (any device, any dtype torch casts to
            `dtype`); the writer converts and writes it in bounded chunks.
        dtype: the output's safetensors dtype.

    Raises:
        SurgeryError: a dtype torch cannot write (F4, F6_*).
    """
    torch_dtype(dtype)  # fail at planning time, not halfway through a write
    return OutputTensor(name, dtype, tuple(values.shape), (), values=values.detach())


def blend_of(
    sources: Sequence[Source],
    dtype: str | None = None,
    divisor: float = 1.0,
    *,
    name: str | None = None,
) -> OutputTensor:
    """An output tensor that blends float sources (all of one shape and dtype), named `name`
    (default: the first source's name)."""
    first = sources[0].tensor
    return OutputTensor(
        name or first.name, dtype or first.dtype, first.shape, tuple(sources), divisor
    )


def joined(name: str, shape: tuple[int, ...], pieces: Sequence[OutputTensor]) -> OutputTensor:
    """An output tensor of `shape` made of `pieces` (each some of its rows, in order, all of one
    dtype) written back to back; a single piece is the tensor itself."""
    if len(pieces) == 1:
        return replace(pieces[0], name=name)
    dtypes = {p.dtype for p in pieces}
    if len(dtypes) != 1 or sum(p.shape[0] for p in pieces) != shape[0]:
        raise ValueError(f"pieces of {name!r} do not make its shape {shape} in one dtype")
    return OutputTensor(name, dtypes.pop(), shape, (), pieces=tuple(pieces))


def check_compatible(
    checkpoints: Sequence[Checkpoint], labels: Sequence[str], *, float_dtypes_may_differ: bool
) -> None:
    """Require the same tensor names (in one layout) and shapes everywhere, and the same dtypes
    unless `float_dtypes_may_differ` (when --dtype sets the output's; non-float dtypes always
    agree): `matching.match` at its strictest.

    Raises:
        MismatchError: naming the checkpoints and the differing tensors.
    """
    match(checkpoints, labels, float_dtypes_may_differ=float_dtypes_may_differ, renames=False)


def tensors_equal(a: TensorInfo, b: TensorInfo, pool: SourcePool) -> bool:
    """Byte equality of two tensors, compared in bounded chunks."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    left, right = bytearray(min(_COMPARE_CHUNK, a.nbytes)), bytearray(min(_COMPARE_CHUNK, a.nbytes))
    for offset in range(0, a.nbytes, _COMPARE_CHUNK):
        size = min(_COMPARE_CHUNK, a.nbytes - offset)
        pool.get(a.file).read_into(a.start + offset, memoryview(left)[:size])
        pool.get(b.file).read_into(b.start + offset, memoryview(right)[:size])
        if left[:size] != right[:size]:
            return False
    return True


def require_equal_non_float(
    tensors: Sequence[TensorInfo], labels: Sequence[str], pool: SourcePool
) -> None:
    """Non-float tensors are never averaged: they must be identical in every input.

    Raises:
        MismatchError: naming the tensor and the input that differs.
    """
    first = tensors[0]
    for other, label in zip(tensors[1:], labels[1:], strict=True):
        if not tensors_equal(first, other, pool):
            raise MismatchError(
                f"non-float tensor {first.name!r} ({first.dtype}) differs between {labels[0]} "
                f"and {label}; only float tensors are averaged (integer, bool, complex and packed "
                "tensors must be identical in every input)"
            )
