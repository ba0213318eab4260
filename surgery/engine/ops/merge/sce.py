"""sce (arXiv 2408.07990): Select the elements whose task vectors vary most across the models
(`select_topk`, a fraction of the elements of nonzero variance), Calculate each model's weight
from its selected task vector's mean square, Erase the elements whose sign disagrees with the
sum's (TIES's election), then the weighted mean of what is left, added to the base.

Passes: counting the elements of nonzero variance and selecting the variance threshold (one
pass in memory or in a sampled window, see select.py; only when select_topk < 1), the mean
squares, then the map.

Variances tied at the threshold are kept by position (`RankRange`), mergekit's `torch.topk` keeps
an arbitrary few of them; since the weights are mean squares of the selected task vectors, that
choice moves every selected element of the tensor (by 1 ulp of the output, more only where
it nearly cancels), not only the tied ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.select import RankRange, magnitude_keys, sample_positions
from surgery.engine.plan import OutputTensor, copy_of

MIN_WEIGHT_SUM = 1e-6


def _variance(deltas: list[np.ndarray]) -> np.ndarray:
    """The population variance across the models, in float64 and rounded to the work dtype,
    as torch.var accumulates it on CPU (bit for bit on float32 tests). The two passes of
    np.var, by hand: np.var itself is 10x slower on a chunk."""
    mean = deltas[0].astype(np.float64)
    for delta in deltas[1:]:
        mean += delta
    mean /= len(deltas)
    total, deviation = np.zeros_like(mean), np.empty_like(mean)
    for delta in deltas:
        np.subtract(delta, mean, out=deviation)
        np.multiply(deviation, deviation, out=deviation)
        total += deviation
    total /= len(deltas)
    return total.astype(deltas[0].dtype)


class Sce(Kernel):
    """base + sum_i w_i m_i s_i d_i / sum_i w_i m_i: d_i the task vectors, s the selection
    mask, m_i the sign agreement, w_i from mean squares."""

    def __init__(self, job: TensorJob) -> None:
        order = [job.base, *job.non_base]
        super().__init__(job.name, [job.inputs[i] for i in order], job.out_dtype)
        self.topk = float(job.shared["select_topk"])

    def _deltas(self, chunk: list[np.ndarray]) -> list[np.ndarray]:
        base = chunk[0]
        return [np.subtract(m, base, out=m) for m in chunk[1:]]

    def _selection(self, inputs: Inputs) -> RankRange | bool:
        """The top-k variance mask (a `RankRange`), or True / False to keep all or none."""
        if self.topk >= 1:
            return True
        if self.topk <= 0:
            return False

        def keys(first: int) -> Iterator[tuple[int, np.ndarray]]:
            for start, chunk in inputs.chunks(part=range(first, inputs.numel)):
                yield start, magnitude_keys(_variance(self._deltas(chunk)))

        nonzero = sum(int(np.count_nonzero(k)) for _, k in keys(0))
        # mergekit: int(count_nonzero(var) * density), a float32 product.
        k = int(np.float32(nonzero) * np.float32(self.topk))
        if k == 0:
            return False
        width = 32 if inputs.work == np.float32 else 64
        positions = sample_positions(inputs.numel, width)
        sample = None if positions is None else self._sample(inputs, positions)
        return RankRange(keys, width, inputs.numel - k, inputs.numel, inputs.numel, sample)

    def _sample(self, inputs: Inputs, positions: np.ndarray) -> np.ndarray | None:
        """The variance keys at `positions`, or None where the inputs cannot be gathered."""
        values = [inputs.gather(i, positions) for i in range(len(self.inputs))]
        if any(v is None for v in values):
            return None
        return magnitude_keys(_variance(self._deltas(values)))

    def _select(self, selection: RankRange | bool, deltas: list[np.ndarray], start: int) -> None:
        if selection is True:
            return
        if selection is False:
            for delta in deltas:
                delta[...] = 0
            return
        keep = selection.mask(magnitude_keys(_variance(deltas)), start)
        for delta in deltas:
            delta *= keep

    def prepare(self, inputs: Inputs) -> tuple[RankRange | bool, list[float]]:
        """The selection, then the weights from the selected task vectors' mean squares."""
        selection = self._selection(inputs)
        squares = np.zeros(len(self.inputs) - 1)
        for start, chunk in inputs.chunks():
            deltas = self._deltas(chunk)
            self._select(selection, deltas, start)
            squares += [float(np.add.reduce(d * d)) for d in deltas]
        means = squares / max(inputs.numel, 1)
        total = float(means.sum())
        if abs(total) < MIN_WEIGHT_SUM:
            weights = [1 / len(means)] * len(means)
        else:
            weights = [float(m / total) for m in means]
        return selection, weights

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The elected, weighted mean of the selected task vectors, added to the base."""
        selection, weights = state
        work = inputs.work
        weights = [work(w) for w in weights]
        for start, chunk in inputs.chunks(part=part):
            base = chunk[0].copy()
            deltas = self._deltas(chunk)
            self._select(selection, deltas, start)
            total = deltas[0].copy()
            for delta in deltas[1:]:
                total += delta
            positive = total >= 0
            merged = np.zeros_like(base)
            divisor = np.zeros_like(base)
            for delta, weight in zip(deltas, weights, strict=True):
                agree = (np.equal(delta > 0, positive) & (delta != 0)).astype(work)
                agree *= weight
                divisor += agree
                delta *= agree
                merged += delta
            np.maximum(divisor, work(MIN_WEIGHT_SUM), out=divisor)
            merged /= divisor
            out.put(start, np.add(base, merged, out=base))


def build(job: TensorJob) -> OutputTensor:
    """One sce tensor; the base itself where no other model feeds it, as mergekit."""
    if not job.non_base:
        return copy_of(job.inputs[job.base], job.out_dtype)
    return computed(Sce(job), job.shape)


METHOD = Method(
    name="sce",
    params=(
        Param("int8_mask", Scope.SHARED, bool, False),  # a mask dtype in mergekit; no effect here
        Param("select_topk", Scope.SHARED, float, 1.0),
    ),
    build=build,
    base=Base.REQUIRED,
)
