"""passthrough: one input per tensor, copied (byte for byte) or multiplied by `scale`."""

from __future__ import annotations

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Method, Param, Scope, TensorJob
from surgery.engine.plan import OutputTensor, copy_of


class Scaled(Kernel):
    """x * scale, rounded once."""

    def __init__(self, job: TensorJob, scale: float) -> None:
        super().__init__(job.name, job.inputs, job.out_dtype)
        self.scale = scale

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """One map pass."""
        scale = inputs.work(self.scale)
        for start, (values,) in inputs.chunks(part=part):
            out.put(start, np.multiply(values, scale, out=values))


def build(job: TensorJob) -> OutputTensor:
    """A copy of the only input, or its scaled values."""
    scale = job.per_input[0].get("scale")
    if scale is None:
        return copy_of(job.inputs[0], job.out_dtype)
    return computed(Scaled(job, float(scale)), job.shape)


METHOD = Method(
    name="passthrough",
    params=(Param("scale", Scope.INPUT, float, None),),
    build=build,
    max_inputs=1,
)
