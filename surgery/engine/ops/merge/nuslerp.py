"""nuslerp: slerp between two models (or their task vectors when a base is given), with
t = weight_2 / (weight_1 + weight_2), over the whole flattened tensors (`nuslerp_flatten`)."""

from __future__ import annotations

import math

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.slerp import gram
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.plan import OutputTensor

NORM_EPS = 1e-7
COLINEAR_EPS = 1e-8


class NuSlerp(Kernel):
    """(sin((1-t)theta) v0 + sin(t theta) v1) / sin(theta) [+ base]."""

    def __init__(self, job: TensorJob) -> None:
        first, second = job.non_base
        order = [first, second] + ([job.base] if job.base is not None else [])
        super().__init__(job.name, [job.inputs[i] for i in order], job.out_dtype)
        w0, w1 = (float(job.per_input[i]["weight"]) for i in (first, second))
        self.t = 0.5 if abs(w0 + w1) < 1e-6 else w1 / (w0 + w1)
        self.has_base = job.base is not None

    def _vectors(self, chunk: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        if self.has_base:
            return chunk[0] - chunk[2], chunk[1] - chunk[2]
        return chunk[0], chunk[1]

    def prepare(self, inputs: Inputs) -> float:
        """The cosine between the two vectors, from one reduction pass."""
        g = gram(inputs, [lambda c: self._vectors(c)[0], lambda c: self._vectors(c)[1]])
        n0 = max(math.sqrt(g[0, 0]), NORM_EPS)
        n1 = max(math.sqrt(g[1, 1]), NORM_EPS)
        return min(1.0, max(-1.0, g[0, 1] / (n0 * n1)))

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The slerp of the two vectors (plus the base)."""
        cos, work, t = state, inputs.work, self.t
        colinear = (1 - cos * cos) <= COLINEAR_EPS**2
        theta = 0.0 if colinear else math.acos(cos)
        s0, s1, sin = (work(v) for v in (math.sin((1 - t) * theta), math.sin(t * theta), 1.0))
        if not colinear:
            sin = work(math.sin(theta))
        for start, chunk in inputs.chunks(part=part):
            v0, v1 = self._vectors(chunk)
            result = work(1 - t) * v0 + work(t) * v1 if colinear else (s0 * v0 + s1 * v1) / sin
            if self.has_base:
                result = np.add(chunk[2], result, out=result)
            out.put(start, result)


def build(job: TensorJob) -> OutputTensor:
    """One nuslerp tensor."""
    if job.shared["nuslerp_row_wise"] or not job.shared["nuslerp_flatten"]:
        raise MergeConfigError(
            "nuslerp: only nuslerp_flatten: true (the default) is supported, not row-wise slerp"
        )
    return computed(NuSlerp(job), job.shape)


METHOD = Method(
    name="nuslerp",
    params=(
        Param("weight", Scope.NON_BASE),
        Param("nuslerp_row_wise", Scope.SHARED, bool, False),
        Param("nuslerp_flatten", Scope.SHARED, bool, True),
    ),
    build=build,
    base=Base.OPTIONAL,
    non_base_count=(2, 2),
)
