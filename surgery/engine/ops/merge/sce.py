"""sce (arXiv 2408.07990): Select the elements whose task vectors vary most across the models
(`select_topk`, a fraction of the elements of nonzero variance), Calculate each model's weight
from its selected task vector's mean square, Erase the elements whose sign disagrees with the
sum's (TIES's election), then the weighted mean of what is left, added to the base.

Passes (only when 0 < select_topk < 1; else the map alone): the first pass counts the elements
of nonzero variance and keeps the keys in a window around the threshold, estimated from a sample
(see select.py; a window that misses takes a pass of its own); then the mean squares; then the
map. A tensor whose keys fit `HELD_BYTES` keeps them from the first pass; a larger one keeps
its selection as bits from the mean-square pass (up to `MASK_BYTES`). The map runs in split
order (`Inputs.chunk_split_into`) on bf16, but in the one chunk where tied keys are kept by
position.

Variances tied at the threshold are kept by position (`RankRange`), mergekit's `torch.topk` keeps
an arbitrary few of them; since the weights are mean squares of the selected task vectors, that
choice moves every selected element of the tensor (by 1 ulp of the output, more only where
it nearly cancels), not only the tied ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np

from surgery.engine.ops.merge import select
from surgery.engine.ops.merge.arrays import Inputs, Output, Scratch, work_dtype
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.select import (
    Deferred,
    Keys,
    RankRange,
    count_slack,
    magnitude_keys,
    sample_positions,
)
from surgery.engine.plan import OutputTensor, copy_of

MIN_WEIGHT_SUM = 1e-6
# Variance keys one job may keep (per worker): a 5632 x 2048 projection's float32 keys fit.
HELD_BYTES = 48 * 2**20
# Bits of selection masks a larger tensor keeps from its mean-square pass for its map, which
# then computes no variance: a 32000 x 2048 embedding's take 8 MB.
MASK_BYTES = 32 * 2**20


def _variance(
    deltas: list[np.ndarray],
    scratch: Scratch | None = None,
    base: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The population variance across the models, in float64 and rounded to the work dtype,
    as torch.var accumulates it on CPU (bit for bit on float32 tests). The two passes of
    np.var, by hand (np.var itself is 10x slower on a chunk), in `scratch`'s arrays where
    given: the result is then its "variance" array, or `out` where given.

    `base` given: `deltas` are the models' values, and each task vector is rounded in the work
    dtype as it is widened (no work-dtype copy of it)."""
    count = len(deltas[0])
    scratch = scratch or Scratch(count)
    wide = [scratch.get(f"wide{i}", np.float64, count) for i in range(len(deltas))]
    for delta, value in zip(deltas, wide, strict=True):
        if base is None:
            np.copyto(value, delta)  # exact: every float32 is a float64
        else:  # the work dtype's difference, widened exactly
            np.subtract(delta, base, out=value, dtype=delta.dtype)
    mean = _sum_into(wide, scratch.get("mean", np.float64, count))
    mean /= len(deltas)
    for value in wide:
        value -= mean
        value *= value
    total = wide[0]  # (s0 + s1) + s2 ..., in the first square's array
    for value in wide[1:]:
        total += value
    out = scratch.get("variance", deltas[0].dtype, count) if out is None else out
    # The float64 quotient, rounded once as it is written.
    return np.divide(total, len(deltas), out=out, casting="same_kind")


def _sum_into(arrays: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """(a0 + a1) + a2 ... in `out`, in that order (the floats torch's sum gives)."""
    if len(arrays) == 1:
        np.copyto(out, arrays[0])
    else:
        np.add(arrays[0], arrays[1], out=out)
    for array in arrays[2:]:
        out += array
    return out


def _split_bools(ordered: np.ndarray, out: np.ndarray, odd: np.ndarray) -> np.ndarray:
    """The bools of `ordered` (an even count) in split order (`Inputs.chunk_split_into`) in
    `out`; `odd`: uint16 scratch, half as long. Each pair read as one little-endian uint16
    holds the even element in its low byte: contiguous casts, 9x faster than strided copies."""
    pairs, half = ordered.view(np.uint16), len(ordered) // 2
    np.copyto(out[:half].view(np.uint8), pairs, casting="unsafe")  # the low bytes
    np.right_shift(pairs, 8, out=odd)
    np.copyto(out[half:].view(np.uint8), odd, casting="unsafe")
    return out


class Sce(Kernel):
    """base + sum_i w_i m_i s_i d_i / sum_i w_i m_i: d_i the task vectors, s the selection
    mask, m_i the sign agreement, w_i from mean squares.

    A tensor whose variance keys fit `HELD_BYTES` (4 or 8 bytes per element) is computed in one
    job that keeps them: the variances are computed once, for the count, the selection, the
    mean squares and the map. A larger one is mapped in segments: it computes them in its first
    two passes and keeps its selection as bits for the map (up to `MASK_BYTES`).
    """

    def __init__(self, job: TensorJob) -> None:
        order = [job.base, *job.non_base]
        super().__init__(job.name, [job.inputs[i] for i in order], job.out_dtype)
        self.topk = float(job.shared["select_topk"])
        width = np.dtype(work_dtype([*(t.dtype for t in self.inputs), self.out_dtype])).itemsize
        keys = int(np.prod(job.shape)) * width  # bytes of variance keys
        self.segmentable = not 0 < self.topk < 1 or keys > HELD_BYTES
        self.held: np.ndarray | None = None  # the variance keys, in the one job that keeps them

    def _deltas(self, chunk: list[np.ndarray]) -> list[np.ndarray]:
        base = chunk[0]
        return [np.subtract(m, base, out=m) for m in chunk[1:]]

    def _decoded(
        self, inputs: Inputs, start: int, stop: int, scratch: Scratch, split: bool = False
    ) -> list:
        """The base and the models' elements [start, stop), in `scratch` (in split order where
        `split`, see `Inputs.chunk_split_into`)."""
        count = stop - start
        decode = inputs.chunk_split_into if split else inputs.chunk_into
        return [
            decode(i, start, stop, scratch.get(f"input{i}", inputs.work, count))
            for i in range(len(self.inputs))
        ]

    def _chunk(
        self, inputs: Inputs, start: int, stop: int, scratch: Scratch, split: bool = False
    ) -> list:
        """The base and the task vectors of elements [start, stop), in `scratch` (in split
        order where `split`)."""
        chunk = self._decoded(inputs, start, stop, scratch, split)
        return [chunk[0], *self._deltas(chunk)]

    def _chunk_keys(
        self,
        inputs: Inputs,
        start: int,
        stop: int,
        scratch: Scratch,
        out: np.ndarray | None = None,
        any_order: bool = False,
    ) -> np.ndarray:
        """The variance keys of elements [start, stop): in `out` (work floats) where given,
        else in `scratch`, in any order where `any_order` (a pass that only counts them)."""
        # The variance is elementwise: computed in split order (cheaper to decode) where the
        # keys' order does not matter or they land in `out`, written back there in order.
        split = (out is not None or any_order) and inputs.splits(stop - start)
        base, *models = self._decoded(inputs, start, stop, scratch, split)
        variance = _variance(models, scratch, base=base, out=None if split else out)
        keys = magnitude_keys(variance, variance)  # in place: a variance is never needed again
        if not split or out is None:
            return keys
        half = len(keys) // 2
        held = out.view(keys.dtype)
        held[0::2], held[1::2] = keys[:half], keys[half:]
        return held

    def _keys(self, inputs: Inputs) -> Keys:
        """Starts a pass over the variance keys: computed, or read from those kept."""
        held = self.held

        def keys(first: int) -> Iterator[tuple[int, np.ndarray]]:
            scratch = Scratch(min(self.step, max(inputs.numel - first, 0)))
            for start in range(first, inputs.numel, self.step):
                stop = min(start + self.step, inputs.numel)
                if held is not None:
                    yield start, held[start:stop]
                else:
                    yield start, self._chunk_keys(inputs, start, stop, scratch)

        return keys

    def _selection(self, inputs: Inputs) -> RankRange | bool:
        """The top-k variance mask (a `RankRange`), or True / False to keep all or none; the
        keys held on the way in the one job that keeps them."""
        if self.topk >= 1:
            return True
        if self.topk <= 0:
            return False
        width = 32 if inputs.work == np.float32 else 64
        # A job that holds its keys has no use for a copy of them (an in-memory selection):
        # its first pass finds the threshold in a window, as a larger tensor's does.
        positions = sample_positions(inputs.numel, width, in_memory=self.segmentable)
        sample = None if positions is None else self._sample(inputs, positions)
        nonzero, found = self._counted(inputs, sample)
        k = self._top(nonzero)
        if k == 0:
            return False
        if sample is None and positions is not None and self.held is not None:
            sample = self.held[positions]  # inputs not gathered (a Hub file): the held keys
        keys = self._keys(inputs)
        return RankRange(keys, width, inputs.numel - k, inputs.numel, inputs.numel, sample, found)

    def _top(self, nonzero: int) -> int:
        """How many variances are selected; mergekit: int(count_nonzero(var) * density), a
        float32 product."""
        return int(np.float32(nonzero) * np.float32(self.topk))

    def _counted(self, inputs: Inputs, sample: np.ndarray | None) -> tuple[int, list | None]:
        """One pass over the variance keys, held as they come in the one job that keeps them:
        how many are nonzero and, given a `sample` of them, the threshold's key found in the
        same pass (a window around its rank estimated from the sample's zeros; None where it
        missed, then selected in a pass of its own)."""
        numel = inputs.numel
        held = None if self.segmentable else self._hold(inputs)
        scratch = Scratch(min(self.step, numel))
        zeros = done = 0

        def first(begin: int) -> Iterator[tuple[int, np.ndarray]]:
            nonlocal zeros, done
            for start in range(begin, numel, self.step):
                stop = min(start + self.step, numel)
                into = None if held is None else held[start:stop]
                keys = self._chunk_keys(inputs, start, stop, scratch, into, any_order=True)
                zeros, done = zeros + len(keys) - int(np.count_nonzero(keys)), stop
                yield start, keys

        found = None
        if sample is not None:
            ordered = np.sort(sample)
            m, sampled_zeros = len(ordered), int(np.searchsorted(ordered, 0, side="right"))
            estimate = numel - int(numel * (m - sampled_zeros) / m * self.topk)
            slack = count_slack(sampled_zeros, m, self.topk)
            exact = Deferred(lambda: [numel - self._top(numel - zeros)], slack)
            found = select._in_window(first, ordered, [estimate], numel, exact)
        for _ in first(done):  # the rest of the pass: all of it without a sample
            pass
        if held is not None:
            self.held = held.view(np.uint32 if inputs.work == np.float32 else np.uint64)
        return numel - zeros, found

    def _sample(self, inputs: Inputs, positions: np.ndarray) -> np.ndarray | None:
        """The variance keys at `positions`, or None where the inputs cannot be gathered."""
        values = [inputs.gather(i, positions) for i in range(len(self.inputs))]
        if any(v is None for v in values):
            return None
        return magnitude_keys(_variance(self._deltas(values)))

    def _keep(
        self,
        selection: RankRange | bool,
        deltas: list[np.ndarray],
        start: int,
        scratch: Scratch,
        split: bool = False,
        masks: dict[int, np.ndarray] | None = None,
    ) -> np.ndarray | None:
        """Which elements of the chunk at `start` the selection keeps (None: all of them), in
        split order where `split` (a chunk not `positional`); from `masks` (packed bits by
        chunk start) where it holds the chunk's."""
        if selection is True:
            return None
        count = len(deltas[0])
        keep = scratch.get("keep", bool, count)
        if selection is False:
            keep[...] = False
            return keep
        spare = scratch.get("spare", bool, count)
        packed = None if masks is None else masks.get(start)
        if packed is not None:
            ordered = np.unpackbits(packed, count=count).view(bool)
        elif self.held is None:  # from the deltas: in their order
            variance = _variance(deltas, scratch)
            keys = magnitude_keys(variance, variance)
            return selection.mask(keys, start, keep, spare, stop=start + count)
        else:
            keys = self.held[start : start + count]
            if not split:
                return selection.mask(keys, start, keep, spare)
            ordered = selection.mask(keys, start, scratch.get("ordered", bool, count), spare)
        if not split:
            return ordered
        # In order, then split: numpy compares strided keys 10x slower than contiguous ones.
        return _split_bools(ordered, keep, scratch.get("odd", np.uint16, count // 2))

    def _select(
        self,
        selection: RankRange | bool,
        deltas: list[np.ndarray],
        start: int,
        scratch: Scratch,
    ) -> np.ndarray | None:
        """The selected task vectors: the others' elements set to 0, in place; returns the
        mask (None: all kept)."""
        keep = self._keep(selection, deltas, start, scratch)
        if keep is not None:
            for delta in deltas:
                delta *= keep
        return keep

    def _hold(self, inputs: Inputs) -> np.ndarray:
        """Where this one job keeps its variance keys (work floats, filled by the first pass):
        computed once for every pass."""
        return np.empty(inputs.numel, inputs.work)

    def prepare(self, inputs: Inputs) -> tuple:
        """The selection, then the weights from the selected task vectors' mean squares, and
        the masks of the selection by chunk start (packed bits) where it was computed from
        variances (a tensor whose keys are not held, up to `MASK_BYTES` of bits)."""
        selection = self._selection(inputs)
        # Masks computed from variances (no keys held) are kept for the map, as bits.
        remember = self.held is None and isinstance(selection, RankRange)
        remember = remember and inputs.numel <= 8 * MASK_BYTES
        masks: dict[int, np.ndarray] | None = {} if remember else None
        squares = np.zeros(len(self.inputs) - 1)
        scratch = Scratch(min(self.step, inputs.numel))
        for start in range(0, inputs.numel, self.step):
            stop = min(start + self.step, inputs.numel)
            deltas = self._chunk(inputs, start, stop, scratch)[1:]
            keep = self._select(selection, deltas, start, scratch)
            if remember:
                masks[start] = np.packbits(keep)
            square = scratch.get("square", inputs.work, stop - start)
            squares += [float(np.add.reduce(np.multiply(d, d, out=square))) for d in deltas]
        means = squares / max(inputs.numel, 1)
        total = float(means.sum())
        if abs(total) < MIN_WEIGHT_SUM:
            weights = [1 / len(means)] * len(means)
        else:
            weights = [float(m / total) for m in means]
        return selection, weights, masks

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The elected, weighted mean of the selected task vectors, added to the base."""
        try:
            self._map(inputs, out, part, state)
        finally:
            self.held = None  # the one job's keys: freed with it

    def _map(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        selection, weights, masks = state
        weights = [inputs.work(w) for w in weights]
        merged = partial(self._merged, inputs, selection, weights, masks)
        scratch = Scratch(min(self.step, len(part)))
        for start in range(part.start, part.stop, self.step):
            stop = min(start + self.step, part.stop)
            # bf16 in and out, elementwise: in split order (fewer passes to decode and encode)
            # but in the one chunk whose selection looks at positions.
            split = self.out_dtype == "BF16" and inputs.splits(stop - start)
            if split and isinstance(selection, RankRange):
                split = not selection.positional(start, stop)
            if split:
                encoded = scratch.get("encoded", inputs.work, stop - start)
                if out.put_split(start, merged(start, stop, scratch, split), encoded):
                    continue
            out.put(start, merged(start, stop, scratch))

    def _merged(
        self,
        inputs: Inputs,
        selection: RankRange | bool,
        weights: list,
        masks: dict[int, np.ndarray] | None,
        start: int,
        stop: int,
        scratch: Scratch,
        split: bool = False,
    ) -> np.ndarray:
        """The merged elements [start, stop), before their rounding (in split order where
        `split`)."""
        base, *deltas = self._chunk(inputs, start, stop, scratch, split)
        keep = self._keep(selection, deltas, start, scratch, split, masks)
        return np.add(base, self._elect(deltas, weights, keep, scratch), out=base)

    def _elect(
        self,
        deltas: list[np.ndarray],
        weights: list,
        keep: np.ndarray | None,
        scratch: Scratch,
    ) -> np.ndarray:
        """sum_i w_i m_i s_i d_i / sum_i w_i m_i over one chunk (the deltas changed in place).

        The selection is folded into the agreement m_i rather than applied to the deltas: an
        element not kept has the weight 0, and d * 0 is the zero (d * 0) * 0 was, sign included.
        The sum's sign only matters where an element is kept, and there the masked and unmasked
        sums are the same floats."""
        count, work = len(deltas[0]), deltas[0].dtype.type
        total = _sum_into(deltas, scratch.get("sum", work, count))
        positive = np.greater_equal(total, 0, out=scratch.get("positive", bool, count))
        merged = scratch.get("merged", work, count)
        merged[...] = 0  # +0 + x: a sum of zeros is +0, as mergekit's
        divisor = scratch.get("divisor", work, count)
        agree, other = scratch.get("agree", bool, count), scratch.get("other", bool, count)
        weighted = scratch.get("weighted", work, count)
        for i, (delta, weight) in enumerate(zip(deltas, weights, strict=True)):
            np.greater(delta, 0, out=agree)
            np.equal(agree, positive, out=agree)
            agree &= np.not_equal(delta, 0, out=other)
            if keep is not None:
                agree &= keep
            # weight or 0, as 1.0 or 0.0 * weight; the first is the divisor itself (0 + x = x)
            np.multiply(agree, weight, out=divisor if i == 0 else weighted)
            if i:
                divisor += weighted
            delta *= divisor if i == 0 else weighted
            merged += delta
        np.maximum(divisor, work(MIN_WEIGHT_SUM), out=divisor)
        merged /= divisor
        return merged


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
