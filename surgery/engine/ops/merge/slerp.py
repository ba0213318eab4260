"""slerp: spherical interpolation from the base (t = 0) to the other model (t = 1).

One reduction pass (|a|^2, |b|^2 and a.b of the whole tensor, in float64), then one map pass of
coef_a * a + coef_b * b. Nearly collinear tensors (|cos| > 0.9995) are interpolated linearly.
"""

from __future__ import annotations

import math

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.plan import OutputTensor

DOT_THRESHOLD = 0.9995
EPS = 1e-8


def gram(inputs: Inputs, vectors: list) -> np.ndarray:
    """The matrix of dot products of `vectors` (functions of a chunk list), in float64."""
    size = len(vectors)
    total = np.zeros((size, size))
    for _, chunk in inputs.chunks():
        values = [v(chunk).astype(np.float64) for v in vectors]
        for i in range(size):
            for j in range(i, size):
                # einsum, not np.dot: BLAS would start its own threads for every chunk, which
                # spin against the writer's workers (measured: 3x the CPU time of the merge).
                total[i, j] += float(np.einsum("i,i->", values[i], values[j]))
                total[j, i] = total[i, j]
    return total


def slerp_coefficients(t: float, dot: float) -> tuple[float, float]:
    """(coef_a, coef_b) for unit vectors with cosine `dot`, as mergekit computes them."""
    dot = min(1.0, max(-1.0, dot))
    if abs(dot) > DOT_THRESHOLD:
        return 1 - t, t
    theta = math.acos(dot)
    return math.sin((1 - t) * theta) / math.sin(theta), math.sin(t * theta) / math.sin(theta)


class Slerp(Kernel):
    """coef_a * base + coef_b * other, coefficients from the whole tensors' angle."""

    def __init__(self, job: TensorJob) -> None:
        (other,) = job.non_base
        super().__init__(job.name, [job.inputs[job.base], job.inputs[other]], job.out_dtype)
        self.t = float(job.shared["t"])

    def run(self, inputs: Inputs, out: Output) -> None:
        """A reduction pass, then the map."""
        g = gram(inputs, [lambda c: c[0], lambda c: c[1]])
        norm_a, norm_b = math.sqrt(g[0, 0]), math.sqrt(g[1, 1])
        norm_a = norm_a if norm_a > EPS else 1.0
        norm_b = norm_b if norm_b > EPS else 1.0
        coef_a, coef_b = slerp_coefficients(self.t, g[0, 1] / (norm_a * norm_b))
        a, b = inputs.work(coef_a), inputs.work(coef_b)
        for start, (x, y) in inputs.chunks():
            x *= a
            x += b * y
            out.put(start, x)


def build(job: TensorJob) -> OutputTensor:
    """One slerp tensor."""
    return computed(Slerp(job), job.shape)


METHOD = Method(
    name="slerp",
    params=(Param("t", Scope.SHARED),),
    build=build,
    base=Base.REQUIRED,
    min_inputs=2,
    max_inputs=2,
)
