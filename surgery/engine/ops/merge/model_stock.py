"""model_stock: interpolate between the base and the average of the models by a ratio from the
mean angle between their task vectors (Model Stock, arXiv 2403.19522), over whole tensors."""

from __future__ import annotations

import math

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.slerp import gram
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.plan import OutputTensor


class ModelStock(Kernel):
    """t * mean(models) + (1 - t) * base, t = N cos / (1 + (N - 1) cos)."""

    def __init__(self, job: TensorJob) -> None:
        order = [job.base, *job.non_base]
        super().__init__(job.name, [job.inputs[i] for i in order], job.out_dtype)

    def prepare(self, inputs: Inputs) -> float:
        """t from the Gram matrix of the task vectors (one reduction pass)."""
        count = len(self.inputs) - 1
        # In place: each model's array is read by its own task vector only.
        offsets = [lambda c, i=i: np.subtract(c[i], c[0], out=c[i]) for i in range(1, count + 1)]
        g = gram(inputs, offsets)
        norms = np.sqrt(np.diag(g))
        cosines = [
            min(1.0, max(-1.0, g[i, j] / max(norms[i] * norms[j], 1e-6)))
            for i in range(count)
            for j in range(i + 1, count)
        ]
        cos = sum(cosines) / len(cosines)
        denominator = 1 + (count - 1) * cos
        return 0.0 if abs(denominator) < 1e-6 else count * cos / denominator

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """t * mean(models) + (1 - t) * base, t from `prepare`: the models' sum scaled once by
        t / N (one pass fewer than mergekit's mean, then times t; float32's last bits only)."""
        work = inputs.work
        t = work(state)
        scale = t / work(len(self.inputs) - 1)
        for start, (base, *models) in inputs.chunks(part=part, reuse=True):
            total = models[0]  # decoded for this chunk: ours to overwrite
            for model in models[1:]:
                total += model
            total *= scale
            base *= work(1) - t
            out.put(start, np.add(total, base, out=total))


def build(job: TensorJob) -> OutputTensor:
    """One model_stock tensor."""
    if job.shared["filter_wise"]:
        raise MergeConfigError("model_stock: filter_wise: true is not supported")
    if math.prod(job.shape) == 0:
        raise MergeConfigError(f"model_stock: {job.name!r} is empty")
    return computed(ModelStock(job), job.shape)


METHOD = Method(
    name="model_stock",
    params=(Param("filter_wise", Scope.SHARED, bool, False),),
    build=build,
    base=Base.REQUIRED,
    min_inputs=3,
)
