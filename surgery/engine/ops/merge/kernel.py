"""A kernel computes one output tensor from its inputs in chunked passes; the writer calls it.

Each method's kernel runs zero or more reduction passes over its inputs (norms, dot products,
thresholds) and then one elementwise map pass, writing each chunk at its place in the shard.
Memory is a few chunks per worker whatever the tensor's size.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS, Inputs, Output, work_dtype
from surgery.engine.plan import OutputTensor, Source
from surgery.engine.reader import TensorInfo
from surgery.engine.shard_hash import OrderedHash
from surgery.engine.source import SourcePool

# A kernel may compute a tensor of up to this many elements in one job (reductions and map,
# not segments): what its reduction passes found per element can then be kept for the map
# (a bit per element for DARE's masks).
WHOLE_ELEMENTS = 2**24


class Kernel(ABC):
    """Computes one output tensor: `prepare` runs the reduction passes over the whole tensor,
    `map_part` the elementwise pass over a range of it, given what `prepare` returned."""

    # Whether `map_part` may run on separate segments, in separate jobs, once `prepare` is done
    # (False when the map carries state from chunk to chunk).
    segmentable = True
    # Elements per chunk of the map pass; segments are whole multiples of it, so chunk-keyed
    # random masks (DARE, DELLA) are the same however the tensor is split.
    step = CHUNK_ELEMENTS

    def __init__(self, name: str, inputs: Sequence[TensorInfo], out_dtype: str) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.out_dtype = out_dtype

    def open(self, pool: SourcePool) -> Inputs:
        """The inputs, read as the work dtype (float32, or float64 when any tensor is)."""
        return Inputs(
            pool, self.inputs, work_dtype([*(t.dtype for t in self.inputs), self.out_dtype])
        )

    def write(
        self,
        pool: SourcePool,
        fd: int,
        offset: int,
        progress: object,
        hasher: OrderedHash,
        part: range | None = None,
        state: object = None,
    ) -> None:
        """Compute the tensor, or the elements in `part` given `prepare`'s `state`, and write
        them at byte `offset` of the open shard `fd`, feeding the bytes written to `hasher`."""
        inputs = self.open(pool)
        out = Output(fd, offset, self.name, self.out_dtype, inputs, progress, hasher)
        with _quiet():
            if part is None:
                part, state = range(inputs.numel), self.prepare(inputs)
            self.map_part(inputs, out, part, state)

    def prepare_from(self, pool: SourcePool) -> object:
        """`prepare` on the inputs opened from `pool`: a segmented tensor's reduction passes,
        run before its parts are written."""
        with _quiet():
            return self.prepare(self.open(pool))

    def prepare(self, inputs: Inputs) -> object:
        """The reduction passes (norms, thresholds, rescaling factors); none by default."""
        return None

    @property
    def reduces(self) -> bool:
        """Whether `prepare` reads the inputs (a pass over them before the map's)."""
        return type(self).prepare is not Kernel.prepare

    @abstractmethod
    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """`out.put` every chunk of the result whose elements lie in `part`."""

    def parts(self, numel: int, size: int) -> list[range]:
        """`range(numel)` cut into segments of about `size` elements, whole steps each."""
        size = max(self.step, size // self.step * self.step)
        return [range(s, min(s + size, numel)) for s in range(0, numel, size)]


def _quiet() -> np.errstate:
    """numpy's overflow warnings off: an overflow in the arithmetic is refused where the chunk
    is rounded (`Output.put`), and the warnings would only add lines to the one-line error."""
    return np.errstate(over="ignore", invalid="ignore")


def computed(kernel: Kernel, shape: tuple[int, ...]) -> OutputTensor:
    """The output tensor `kernel` writes (its inputs listed as sources, for checks and reports)."""
    return OutputTensor(
        kernel.name,
        kernel.out_dtype,
        shape,
        tuple(Source(t) for t in kernel.inputs),
        kernel=kernel,
    )


def chunk_rng(seed: int, name: str, model: int, start: int) -> np.random.Generator:
    """The random generator of one chunk: a function of (seed, tensor name, model, position)
    only, so masks never depend on thread timing or on which other tensors were merged."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    key = [seed, int.from_bytes(digest, "little"), model, start]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))
