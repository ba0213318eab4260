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


# Elements per partial sum of a dot product (see `dot`).
DOT_BLOCK = 256


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a * b) of two chunks in the work dtype: einsum's sum of products over blocks of
    `DOT_BLOCK` elements, then numpy's pairwise sum of the blocks' sums. As exact as a product
    array summed pairwise (measured 1.3e-10 of sum |a * b| on a 2^17-element chunk, like it;
    one einsum over the whole chunk was 50x less exact, and moved a Model Stock weight by 2 ulps
    against mergekit's) in a third less CPU: one pass, no temporary."""
    whole = len(a) - len(a) % DOT_BLOCK
    blocks = np.einsum(
        "ij,ij->i", a[:whole].reshape(-1, DOT_BLOCK), b[:whole].reshape(-1, DOT_BLOCK)
    )
    return float(np.add.reduce(blocks)) + float(np.add.reduce(a[whole:] * b[whole:]))


def gram(inputs: Inputs, vectors: list) -> np.ndarray:
    """The matrix of dot products of `vectors` (functions of a chunk list, called once per chunk
    in order; one may overwrite the chunk's array it alone reads), summed over chunks in float64.
    The chunks are decoded into the same arrays (no allocation per chunk: measured 20-30% less
    CPU than fresh arrays, the same sums bit for bit).

    Within a chunk each product is summed in the work dtype by `dot` (about 1e-7 relative error,
    as torch sums). Not np.dot: BLAS would start its own threads for every chunk, which spin
    against the writer's workers (measured: 3x the CPU time of the merge), and its float32 dot
    was 40x less exact.
    """
    size = len(vectors)
    total = np.zeros((size, size))
    for _, chunk in inputs.chunks(reuse=True):
        values = [v(chunk) for v in vectors]
        for i in range(size):
            for j in range(i, size):
                total[i, j] += dot(values[i], values[j])
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

    def prepare(self, inputs: Inputs) -> tuple[float, float]:
        """The coefficients, from one reduction pass."""
        g = gram(inputs, [lambda c: c[0], lambda c: c[1]])
        norm_a, norm_b = math.sqrt(g[0, 0]), math.sqrt(g[1, 1])
        norm_a = norm_a if norm_a > EPS else 1.0
        norm_b = norm_b if norm_b > EPS else 1.0
        return slerp_coefficients(self.t, g[0, 1] / (norm_a * norm_b))

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """coef_a * x + coef_b * y."""
        a, b = (inputs.work(c) for c in state)
        for start, (x, y) in inputs.chunks(part=part):
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
