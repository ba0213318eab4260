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

    def write(
        self, pool: SourcePool, fd: int, offset: int, progress: object, hasher: OrderedHash
    ) -> None:
        """Compute the tensor and write it at byte `offset` of the open shard `fd`, feeding the
        bytes written to the shard's `hasher`."""
        work = work_dtype([*(t.dtype for t in self.inputs), self.out_dtype])
        out = Output(fd, offset, self.out_dtype, progress, hasher)
        self.run(Inputs(pool, self.inputs, work), out)

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
