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

from surgery.engine.ops.merge.arrays import Inputs, Output, work_dtype
from surgery.engine.plan import OutputTensor, Source
from surgery.engine.reader import TensorInfo
from surgery.engine.shard_hash import OrderedHash
from surgery.engine.source import SourcePool


class Kernel(ABC):
    """Computes one output tensor; subclasses implement `run`."""

    def __init__(self, name: str, inputs: Sequence[TensorInfo], out_dtype: str) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.out_dtype = out_dtype

    # Whether the kernel is one elementwise map (no reduction passes), so the writer may compute
    # segments of the tensor in separate jobs (`run_part`).
    elementwise = False

    def write(
        self,
        pool: SourcePool,
        fd: int,
        offset: int,
        progress: object,
        hasher: OrderedHash,
        part: range | None = None,
    ) -> None:
        """Compute the tensor (only the elements in `part`, for an elementwise kernel) and write
        it at byte `offset` of the open shard `fd`, feeding the bytes written to `hasher`."""
        work = work_dtype([*(t.dtype for t in self.inputs), self.out_dtype])
        out = Output(fd, offset, self.out_dtype, progress, hasher)
        if part is None:
            self.run(Inputs(pool, self.inputs, work), out)
        else:
            self.run_part(Inputs(pool, self.inputs, work), out, part)

    def run_part(self, inputs: Inputs, out: Output, part: range) -> None:
        """`run` on the elements in `part` only; elementwise kernels implement it."""
        raise NotImplementedError(f"{type(self).__name__} needs the whole tensor")

    @abstractmethod
    def run(self, inputs: Inputs, out: Output) -> None:
        """Read `inputs` in passes and `out.put` every chunk of the result once."""


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
