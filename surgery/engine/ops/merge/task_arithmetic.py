"""Task arithmetic and its sparsified, sign-elected variants (TIES, DARE, Breadcrumbs, DELLA).

mergekit's "generalized task arithmetic": each model's delta from the base is sparsified, scaled
by its weight, optionally masked by a TIES sign election (the sign of the weighted sum), summed,
optionally normalized by the (masked) weight sum, scaled by `lambda`, and added to the base. Each
variant below is mergekit's row in its registry: a sparsifier, a consensus flag and defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS, Inputs, Output, Scratch
from surgery.engine.ops.merge.breadcrumbs import Breadcrumbs
from surgery.engine.ops.merge.dare import Dare
from surgery.engine.ops.merge.della import Della, SharedPass
from surgery.engine.ops.merge.kernel import WHOLE_ELEMENTS, Kernel, computed
from surgery.engine.ops.merge.magnitude import Magnitude
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.sparsify import Deltas, KeepAll, Sampled, Sparsifier
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.plan import OutputTensor, copy_of


@dataclass(frozen=True)
class Variant:
    """One row of mergekit's generalized task arithmetic table."""

    name: str
    sparsify: str | None  # magnitude, random, magnitude_outliers, della_magprune
    consensus: bool
    normalize: bool
    rescale: bool


VARIANTS = (
    Variant("task_arithmetic", None, False, False, False),
    Variant("ties", "magnitude", True, True, False),
    Variant("dare_ties", "random", True, False, True),
    Variant("dare_linear", "random", False, False, True),
    Variant("breadcrumbs", "magnitude_outliers", False, False, False),
    Variant("breadcrumbs_ties", "magnitude_outliers", True, False, False),
    Variant("della", "della_magprune", True, True, True),
    Variant("della_linear", "della_magprune", False, False, True),
)


def _row_length(job: TensorJob) -> int:
    """DELLA's row: the last dimension, or a whole 1-D tensor (at least 1: an empty tensor has
    no chunks, but the chunk step must stay a positive multiple of it)."""
    if len(job.shape) > 2:
        raise MergeConfigError(f"DELLA ranks rows of 1-D or 2-D tensors; {job.name!r} is not")
    return max(1, job.shape[-1] if len(job.shape) == 2 else int(np.prod(job.shape)))


class TaskArithmetic(Kernel):
    """base + lambda * combine(weight_i * sparsify(x_i - base))."""

    def __init__(self, job: TensorJob, variant: Variant) -> None:
        super().__init__(job.name, job.inputs, job.out_dtype)
        self.job, self.variant = job, variant
        self.base, self.others = job.base, job.non_base
        self.weights = [float(job.per_input[i]["weight"]) for i in self.others]
        if variant.sparsify == "della_magprune":
            self.row = _row_length(job)  # only DELLA has rows; the others see a flat tensor
            self.step = max(self.row, CHUNK_ELEMENTS // self.row * self.row)  # whole rows
        # DARE's masks are random draws, which cost more than the rest of its map: a tensor of
        # up to WHOLE_ELEMENTS is computed in one job, whose rescaling pass keeps the masks
        # (a bit per element) for the map. A larger one is mapped in segments, drawn twice.
        self.segmentable = not (
            variant.sparsify == "random"
            and bool(job.shared["rescale"])
            and int(np.prod(job.shape)) <= WHOLE_ELEMENTS
        )

    def _deltas(self, inputs: Inputs, index: int) -> Deltas:
        def passes(first: int = 0) -> Iterator[tuple[int, np.ndarray]]:
            # Each chunk is decoded into the previous one's arrays: a consumer keeps nothing of
            # a chunk once it asks for the next.
            scratch = Scratch(min(self.step, max(inputs.numel - first, 0)))
            for start in range(first, inputs.numel, self.step):
                stop = min(start + self.step, inputs.numel)
                base = inputs.chunk_into(
                    self.base, start, stop, scratch.get("base", inputs.work, stop - start)
                )
                delta = scratch.get("delta", inputs.work, stop - start)
                delta = inputs.chunk_into(index, start, stop, delta)
                yield start, np.subtract(delta, base, out=delta)

        return passes

    def _sampled(self, inputs: Inputs, index: int) -> Sampled:
        def sampled(positions: np.ndarray) -> np.ndarray | None:
            base, model = inputs.gather(self.base, positions), inputs.gather(index, positions)
            return None if base is None or model is None else np.subtract(model, base)

        return sampled

    def _sparsifier(self, inputs: Inputs, position: int, index: int) -> Sparsifier:
        params, shared = self.job.per_input[index], self.job.shared
        deltas, numel = self._deltas(inputs, index), inputs.numel
        density, rescale = float(params["density"]), bool(shared["rescale"])
        method = self.variant.sparsify
        if method is None or density >= 1:
            return KeepAll(deltas, numel)
        key = (self.job.seed, self.name, position)
        if method == "della_magprune":  # the one method with rows (set up in __init__)
            epsilon = float(params.get("epsilon", 0))
            return Della(deltas, numel, rescale, density, epsilon, self.row, key)
        # TIES, DARE and Breadcrumbs see the tensor flat, whatever its shape, as mergekit does.
        if method == "random":
            return Dare(deltas, numel, rescale, density, key)
        make: Callable[..., Sparsifier] = {
            "magnitude": Magnitude,
            "magnitude_outliers": partial(Breadcrumbs, gamma=float(params.get("gamma", 0))),
        }[method]
        return make(deltas, numel, rescale, density, self._sampled(inputs, index))

    @property
    def reduces(self) -> bool:
        """Whether a sparsifier passes over the deltas before the map (thresholds, rescaling):
        only a method that sparsifies, at a density below 1."""
        return self.variant.sparsify is not None and any(
            float(self.job.per_input[i]["density"]) < 1 for i in self.others
        )

    def prepare(self, inputs: Inputs) -> list[Sparsifier] | SharedPass:
        """Every sparsifier's reduction passes (thresholds, rescaling factors); DELLA's
        rescaling pass is left to its map jobs (a `SharedPass`)."""
        sparsifiers = [self._sparsifier(inputs, p, i) for p, i in enumerate(self.others)]
        for sparsifier in sparsifiers:
            sparsifier.prepare()
        rescaling = [(s, i) for s, i in zip(sparsifiers, self.others, strict=True) if s.rescale]
        for sparsifier, _ in rescaling:
            # One job: this map follows, whole, so every mask is kept.
            sparsifier.remember_below = 0 if self.segmentable else inputs.numel
        if not rescaling:
            return sparsifiers
        # One pass for every model: the base decoded once per chunk.
        starts, measure = range(0, inputs.numel, self.step), partial(self._measure, rescaling)
        if self.variant.sparsify == "della_magprune":  # run by the map jobs, masks kept
            return SharedPass(sparsifiers, [s for s, _ in rescaling], starts, measure)
        scratch = Scratch(min(self.step, inputs.numel))
        for start in starts:
            measure(inputs, start, scratch)
        for sparsifier, _ in rescaling:
            sparsifier.conclude()
        return sparsifiers

    def _measure(
        self,
        rescaling: list[tuple[Sparsifier, int]],
        inputs: Inputs,
        start: int,
        scratch: Scratch | None = None,
    ) -> None:
        """The rescaling pass over one chunk, for every model in `rescaling`; `scratch`: the
        pass's reused arrays (None: fresh ones, for a pass whose chunks run on any thread)."""
        stop = min(start + self.step, inputs.numel)
        scratch = scratch or Scratch(stop - start)
        base = inputs.chunk_into(
            self.base, start, stop, scratch.get("base", inputs.work, stop - start)
        )
        for sparsifier, index in rescaling:
            delta = scratch.get("delta", inputs.work, stop - start)
            delta = inputs.chunk_into(index, start, stop, delta)
            sparsifier.measure(start, np.subtract(delta, base, out=delta), scratch)

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The one map pass over `part`, with the prepared sparsifiers (every chunk's arrays
        reused from the previous chunk's)."""
        sparsifiers = state.result(inputs) if isinstance(state, SharedPass) else state
        work = inputs.work
        weights = [work(w) for w in self.weights]
        plain_divisor = work(sum(weights, work(0)))  # summed in the work dtype, as mergekit
        if abs(plain_divisor) < 1e-8:
            plain_divisor = work(1)
        shared = self.job.shared
        scratch = Scratch(min(self.step, len(part)))
        for start in range(part.start, part.stop, self.step):
            stop = min(start + self.step, part.stop)
            count = stop - start
            base = inputs.chunk_into(self.base, start, stop, scratch.get("base", work, count))
            deltas = []
            for position, (sparsifier, index, weight) in enumerate(
                zip(sparsifiers, self.others, weights, strict=True)
            ):
                delta = scratch.get(f"delta{position}", work, count)
                delta = inputs.chunk_into(index, start, stop, delta)
                delta -= base
                delta = sparsifier.apply(start, delta, scratch)
                delta *= weight
                deltas.append(delta)
            if self.variant.consensus:
                mixed, divisor = _elect(deltas, weights, scratch)
            else:
                mixed, divisor = _sum(deltas, in_place=True), plain_divisor
            if shared["normalize"]:
                mixed /= divisor
            if float(shared["lambda"]) != 1:
                mixed *= work(shared["lambda"])
            out.put(start, np.add(base, mixed, out=base))


def _elect(
    deltas: list[np.ndarray], weights: list, scratch: Scratch
) -> tuple[np.ndarray, np.ndarray]:
    """TIES sign election ("sum"): keep each delta whose sign is that of the sum. The deltas
    are masked in place; the sum of the kept ones is written over the first."""
    count, dtype = len(deltas[0]), deltas[0].dtype
    total = scratch.get("total", dtype, count)
    if len(deltas) == 1:
        np.copyto(total, deltas[0])
    else:  # (d0 + d1) + d2 ..., the order of `_sum`
        np.add(deltas[0], deltas[1], out=total)
    for delta in deltas[2:]:
        total += delta
    positive = np.greater_equal(total, 0, out=scratch.get("positive", bool, count))
    # d > 0 where the sum is >= 0, d < 0 where it is negative (mergekit's torch.where), as
    # two cheap comparisons: (d > 0) == positive, and d != 0.
    masks, nonzero = [], scratch.get("nonzero", bool, count)
    for position, d in enumerate(deltas):
        mask = np.greater(d, 0, out=scratch.get(f"elected{position}", bool, count))
        np.equal(mask, positive, out=mask)
        mask &= np.not_equal(d, 0, out=nonzero)
        np.multiply(d, mask, out=d)  # d * m, in the caller's arrays
        masks.append(mask)
    mixed = _sum(deltas, in_place=True)
    # sum(w * m) in order, each term w or 0, as mergekit's; then 1 where it is 0.
    divisor = np.multiply(masks[0], weights[0], out=scratch.get("divisor", dtype, count))
    term = scratch.get("term", dtype, count)
    for mask, weight in zip(masks[1:], weights[1:], strict=True):
        divisor += np.multiply(mask, weight, out=term)
    # 0 + 1 where it is 0, x + 0 = x elsewhere: a boolean assignment at scattered places
    # costs 10x more.
    divisor += np.equal(divisor, 0, out=nonzero)
    return mixed, divisor


def _sum(arrays: list[np.ndarray], *, in_place: bool = False) -> np.ndarray:
    """The elementwise sum, in order; `in_place` adds into the first array."""
    total = arrays[0] if in_place else arrays[0].copy()
    for array in arrays[1:]:
        total += array
    return total


def _check(job: TensorJob, variant: Variant) -> None:
    if variant.sparsify != "della_magprune":
        return
    for index in job.non_base:
        density = float(job.per_input[index]["density"])
        epsilon = float(job.per_input[index]["epsilon"])
        if 0 < density < 1 and (density + epsilon >= 1 or density - epsilon <= 0):
            raise MergeConfigError(
                f"{variant.name}: density {density} +/- epsilon {epsilon} must lie in (0, 1)"
            )


def build(job: TensorJob, variant: Variant) -> OutputTensor:
    """One tensor of a generalized task arithmetic merge; the base itself where no other model
    feeds it (a slice whose only source is the base), as mergekit returns it."""
    if not job.non_base:
        return copy_of(job.inputs[job.base], job.out_dtype)
    _check(job, variant)
    return computed(TaskArithmetic(job, variant), job.shape)


def method(variant: Variant) -> Method:
    """The method of one variant, with mergekit's parameters and defaults."""
    params = [
        Param("int8_mask", Scope.SHARED, bool, False),  # a mask dtype in mergekit; no effect here
        Param("normalize", Scope.SHARED, bool, variant.normalize),
        Param("rescale", Scope.SHARED, bool, variant.rescale),
        Param("lambda", Scope.SHARED, float, 1.0),
        Param("weight", Scope.NON_BASE),
        Param("density", Scope.NON_BASE, float, 1.0),
    ]
    if variant.sparsify == "magnitude_outliers":
        params.append(Param("gamma", Scope.NON_BASE, float, 0.01))
    if variant.sparsify == "della_magprune":
        params.append(Param("epsilon", Scope.NON_BASE, float, 0.15))
    return Method(
        name=variant.name,
        params=tuple(params),
        build=partial(build, variant=variant),
        base=Base.REQUIRED,
        random=variant.sparsify in ("random", "della_magprune"),
    )


METHODS = tuple(method(v) for v in VARIANTS)
