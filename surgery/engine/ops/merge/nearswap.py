"""nearswap: take the other model's value where it lies near the base's, the base's elsewhere.

Per element, w = clamp(t / max(|base - other|, 1e-6), 0, 1) and the result is
w * other + (1 - w) * base, as mergekit defines it: elementwise, so one map pass and no
reduction.
"""

from __future__ import annotations

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.plan import OutputTensor

MIN_DIFFERENCE = 1e-6


class NearSwap(Kernel):
    """base + w * (other - base), w = clamp(t / max(|base - other|, 1e-6), 0, 1)."""

    def __init__(self, job: TensorJob) -> None:
        (other,) = job.non_base
        super().__init__(job.name, [job.inputs[job.base], job.inputs[other]], job.out_dtype)
        self.t = float(job.shared["t"])

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The swap weights and the blend, chunk by chunk.

        For t > 0, t / max(|d|, max(1e-6, t)) is mergekit's clamped weight bit for bit (1 where
        |d| <= t, t / max(|d|, 1e-6) < 1 elsewhere) with one clamp instead of two; the floor is an
        array because numpy's maximum against a scalar is 5x slower here. The blend
        base + w * d rounds differently from mergekit's w * other + (1 - w) * base only in
        float32's last bits, far below the output's one rounding to 16 bits.
        """
        work = inputs.work
        t = work(self.t)
        floor = np.full(min(self.step, len(part)), max(work(MIN_DIFFERENCE), t), work)
        for start, (base, other) in inputs.chunks(part=part, reuse=True):
            change = np.subtract(other, base, out=other)
            weight = np.abs(change)
            if t > 0:
                np.maximum(weight, floor[: len(weight)], out=weight)
                np.divide(t, weight, out=weight)
            else:  # mergekit's clamp gives 0 (NaN where the change is NaN, as here)
                np.multiply(weight, 0, out=weight)
            change *= weight
            out.put(start, np.add(base, change, out=change))


def build(job: TensorJob) -> OutputTensor:
    """One nearswap tensor."""
    return computed(NearSwap(job), job.shape)


METHOD = Method(
    name="nearswap",
    params=(Param("t", Scope.SHARED),),
    build=build,
    base=Base.REQUIRED,
    min_inputs=2,
    max_inputs=2,
)
