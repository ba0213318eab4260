"""arcee_fusion: take the other model's value where its change from the base is important,
the base's elsewhere, as mergekit's `arcee_fusion`.

Importance is |other - base| times the KL divergence of the softmaxes of the row (the last
dimension) in the two models; the threshold is median + 1.5 IQR of the importances, from
quantiles of the whole tensor (mergekit's sorted tensor, here a selection in memory)
or, above a million elements, of a random sample of a million (drawn with replacement, as
mergekit does; here reproducibly from (seed, tensor) with `chunk_rng`, chunk by chunk). Chunks
hold whole rows, so one row (at most one input's last dimension; a 1-D tensor is one row) is held
at a time; the reduction pass keeps one KL divergence per row.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS, Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, chunk_rng, computed
from surgery.engine.ops.merge.method import Base, Method, TensorJob
from surgery.engine.ops.merge.select import key_value, ordered_keys, select_ranks
from surgery.engine.plan import OutputTensor

SAMPLE_SIZE = 1_000_000  # mergekit's _QUANTILE_SAMPLE_SIZE
QUANTILES = (0.25, 0.5, 0.75)
KL_EPS = 1e-8


def _softmax(rows: np.ndarray) -> np.ndarray:
    """The softmax of each row, in place."""
    rows -= rows.max(axis=1, keepdims=True)
    np.exp(rows, out=rows)
    rows /= rows.sum(axis=1, keepdims=True)
    return rows


def row_divergence(base: np.ndarray, other: np.ndarray, row: int) -> np.ndarray:
    """KL(softmax(other) || softmax(base)) of each row of `row` elements, as a column, computed
    in place of both arrays (mergekit's operations in its order: the same bits, and no
    temporaries, which made it twice as slow)."""
    work = base.dtype.type
    p = _softmax(other.reshape(-1, row))
    p += work(KL_EPS)
    q = _softmax(base.reshape(-1, row))
    q += work(KL_EPS)
    ratio = np.divide(p, q, out=q)
    np.log(ratio, out=ratio)
    ratio *= p
    return np.add.reduce(ratio, axis=1, keepdims=True)


def scaled(change: np.ndarray, divergence: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The importances |change| * KL of the element's row, given the rows' `divergence` column,
    in `out` (which may be `change`)."""
    importance = np.abs(change, out=out)
    rows = importance.reshape(len(divergence), -1)
    rows *= divergence
    return importance


def _ranks(n: int) -> list[int]:
    """The ranks of the quartiles among `n` sorted values, q * (n - 1) truncated in float32 as
    mergekit indexes its sorted tensor."""
    return [int(np.float32(q) * np.float32(n - 1)) for q in QUANTILES]


class ArceeFusion(Kernel):
    """base + (other - base) * (importance >= median + 1.5 IQR).

    The reduction pass keeps each row's KL divergence (one float per row): the later passes
    and the map then need no softmax, which costs most of the arithmetic.
    """

    def __init__(self, job: TensorJob) -> None:
        (other,) = job.non_base
        super().__init__(job.name, [job.inputs[job.base], job.inputs[other]], job.out_dtype)
        self.row = max(1, job.shape[-1] if len(job.shape) > 1 else int(np.prod(job.shape)))
        self.step = max(self.row, CHUNK_ELEMENTS // self.row * self.row)  # whole rows
        self.seed = job.seed

    def _rows(self, divergence: np.ndarray, start: int, count: int) -> np.ndarray:
        """The divergences of the rows of elements [start, start + count) (whole rows)."""
        return divergence[start // self.row : (start + count) // self.row]

    def _divergences(self, inputs: Inputs, divergence: np.ndarray) -> Iterator[tuple]:
        """(start, importances) chunk by chunk, each row's KL written into `divergence`: the one
        softmax pass."""
        for start, (base, other) in inputs.chunks(self.step, reuse=True):
            change = np.subtract(other, base)
            rows = self._rows(divergence, start, len(base))
            rows[:] = row_divergence(base, other, self.row)
            yield start, scaled(change, rows, out=change)

    def _importances(self, inputs: Inputs, divergence: np.ndarray, part: range | None = None):
        """(start, importances) chunk by chunk, from the rows' divergences."""
        for start, (base, other) in inputs.chunks(self.step, part, reuse=True):
            rows = self._rows(divergence, start, len(base))
            yield start, scaled(np.subtract(other, base, out=other), rows, out=other)

    def _quantiles(self, inputs: Inputs) -> tuple[list[float], np.ndarray]:
        """The importances of ranks q * (n - 1) (truncated, n the tensor's or the sample's
        size), as mergekit indexes its sorted tensor, and every row's divergence."""
        work = inputs.work
        divergence = np.empty((inputs.numel // self.row, 1), work)
        if inputs.numel <= SAMPLE_SIZE:
            for _ in self._divergences(inputs, divergence):
                pass  # the selection's passes then read the divergences
            ranks = _ranks(inputs.numel)
            width = 32 if work == np.float32 else 64
            keys = lambda first: (  # noqa: E731
                (s, ordered_keys(v))
                for s, v in self._importances(inputs, divergence, range(first, inputs.numel))
            )
            found = select_ranks(keys, width, ranks, inputs.numel)
            return [key_value(f.key, work) for f in found], divergence
        # With replacement, as mergekit: how many picks fall in each chunk (multinomial), then
        # where within it; the same distribution as a million positions drawn and sorted, without
        # sorting them (a sort of 10^6 took most of this pass).
        rng = chunk_rng(self.seed, self.name, 0, 0)
        sizes = np.diff([*range(0, inputs.numel, self.step), inputs.numel])
        counts = rng.multinomial(SAMPLE_SIZE, sizes / inputs.numel)
        sample = np.empty(SAMPLE_SIZE, work)
        filled = 0
        chunks = zip(self._divergences(inputs, divergence), counts, strict=True)
        for (_, values), count in chunks:
            sample[filled : filled + count] = values[rng.integers(0, len(values), count)]
            filled += count
        ranks = _ranks(SAMPLE_SIZE)
        sample.partition(ranks)  # each rank's value as a full sort puts it there
        return [sample[rank] for rank in ranks], divergence

    def prepare(self, inputs: Inputs) -> tuple[object, np.ndarray]:
        """The threshold, median + 1.5 (q3 - q1) in the work dtype, as mergekit, and the rows'
        divergences."""
        work = inputs.work
        quantiles, divergence = self._quantiles(inputs)
        q1, median, q3 = (work(v) for v in quantiles)
        return median + work(1.5) * (q3 - q1), divergence

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The fused values, chunk by chunk (whole rows)."""
        threshold, divergence = state
        for start, (base, other) in inputs.chunks(self.step, part, reuse=True):
            rows = self._rows(divergence, start, len(base))
            change = np.subtract(other, base)
            change *= scaled(change, rows, out=other) >= threshold
            out.put(start, np.add(base, change, out=change))


def build(job: TensorJob) -> OutputTensor:
    """One arcee_fusion tensor."""
    return computed(ArceeFusion(job), job.shape)


METHOD = Method(
    name="arcee_fusion",
    params=(),
    build=build,
    base=Base.REQUIRED,
    min_inputs=2,
    max_inputs=2,
)
