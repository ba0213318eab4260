"""nearswap: take the other model's value where it lies near the base's, the base's elsewhere.

Per element, w = clamp(t / max(|base - other|, 1e-6), 0, 1) and the result is
w * other + (1 - w) * base, as mergekit computes it: elementwise, so one map pass and no
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
    """w * other + (1 - w) * base, w = clamp(t / |base - other|, 0, 1)."""

    def __init__(self, job: TensorJob) -> None:
        (other,) = job.non_base
        super().__init__(job.name, [job.inputs[job.base], job.inputs[other]], job.out_dtype)
        self.t = float(job.shared["t"])

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The swap weights and the blend, chunk by chunk."""
        work = inputs.work
        t, one = work(self.t), work(1)
        for start, (a, b) in inputs.chunks(part=part):
            weight = np.abs(a - b)
            np.maximum(weight, work(MIN_DIFFERENCE), out=weight)
            np.divide(t, weight, out=weight)
            np.clip(weight, work(0), one, out=weight)
            b *= weight
            a *= one - weight
            out.put(start, np.add(b, a, out=b))


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
