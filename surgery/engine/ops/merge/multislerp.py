"""multislerp: barycentric interpolation of several models (or their task vectors from an
optional base) on the hypersphere, over whole flattened tensors, as mergekit's `multislerp`.

The result is a linear combination of the inputs: every quantity mergekit computes (norms, the
weighted mean of the unit vectors, its norm, the tangent projections) follows from the Gram
matrix of the (task) vectors. So one reduction pass (the Gram matrix, in float64) gives the
coefficients, and one map pass writes sum_i c_i v_i (+ base).
"""

from __future__ import annotations

import math

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.slerp import gram
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.plan import OutputTensor, copy_of


def coefficients(g: np.ndarray, weights: np.ndarray, eps: float) -> np.ndarray | None:
    """The c_i of the result sum_i c_i v_i, given the Gram matrix `g` of the vectors v_i;
    None when the weighted mean of the unit vectors is (nearly) zero."""
    norms = np.sqrt(np.maximum(np.diag(g), 0))
    scale = 1 / (norms + eps)  # unit_i = v_i * scale_i
    mean = weights * scale  # the weighted mean of the units, as coefficients of the v_i
    mean_norm = math.sqrt(max(float(mean @ g @ mean), 0.0))
    if mean_norm < eps:
        return None
    mean /= mean_norm
    dots = scale * (g @ mean)  # unit_i . mean
    tangent = weights * scale - float(weights @ dots) * mean  # sum_i w_i (unit_i - dot_i mean)
    tangent_norm = math.sqrt(max(float(tangent @ g @ tangent), 0.0)) + eps
    result = mean * math.cos(tangent_norm) + tangent * (math.sin(tangent_norm) / tangent_norm)
    return result * float(norms @ weights)


class MultiSlerp(Kernel):
    """sum_i c_i (x_i - base) + base, or sum_i c_i x_i without a base."""

    def __init__(self, job: TensorJob) -> None:
        self.has_base = job.base is not None
        order = job.non_base + ([job.base] if self.has_base else [])
        super().__init__(job.name, [job.inputs[i] for i in order], job.out_dtype)
        # The weights as mergekit holds them: a float32 tensor (the inputs' dtype), normalized
        # in it.
        weights = np.array([float(job.per_input[i]["weight"]) for i in job.non_base], np.float32)
        if job.shared["normalize_weights"]:
            total = weights.sum(dtype=np.float32)
            if total == 0:
                raise MergeConfigError(f"multislerp: the weights of {job.name!r} sum to 0")
            weights = weights / total
        self.weights = weights.astype(np.float64)
        self.eps = float(job.shared["eps"])
        self.count = len(job.non_base)

    def _vectors(self, chunk: list[np.ndarray]) -> list[np.ndarray]:
        if not self.has_base:
            return chunk
        base = chunk[-1]
        return [np.subtract(v, base, out=v) for v in chunk[:-1]]

    def prepare(self, inputs: Inputs) -> np.ndarray:
        """The coefficients, from the Gram matrix of the vectors (one reduction pass)."""
        if self.has_base:
            # In place: each model's array is read by its own task vector only.
            vectors = [lambda c, i=i: np.subtract(c[i], c[-1], out=c[i]) for i in range(self.count)]
        else:
            vectors = [lambda c, i=i: c[i] for i in range(self.count)]
        result = coefficients(gram(inputs, vectors), self.weights, self.eps)
        if result is not None:
            return result
        if self.count == 2 or inputs.numel == 0:  # mergekit's fallback: the weighted sum
            return self.weights
        raise MergeConfigError(
            f"multislerp: the weighted mean of the unit vectors of {self.name!r} is zero "
            "(antipodal models with balancing weights); choose other weights"
        )

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """sum_i c_i v_i (+ base)."""
        coefs = [inputs.work(c) for c in state]
        for start, chunk in inputs.chunks(part=part):
            vectors = self._vectors(chunk)
            result = vectors[0] * coefs[0]
            for vector, coef in zip(vectors[1:], coefs[1:], strict=True):
                vector *= coef
                result += vector
            if self.has_base:
                result += chunk[-1]
            out.put(start, result)


def build(job: TensorJob) -> OutputTensor:
    """One multislerp tensor; the one model itself when a single model feeds it, as mergekit."""
    if len(job.non_base) == 1:
        return copy_of(job.inputs[job.non_base[0]], job.out_dtype)
    return computed(MultiSlerp(job), job.shape)


METHOD = Method(
    name="multislerp",
    params=(
        Param("weight", Scope.NON_BASE),
        Param("normalize_weights", Scope.SHARED, bool, True),
        Param("eps", Scope.SHARED, float, 1e-8),
    ),
    build=build,
    base=Base.OPTIONAL,
    non_base_count=(1, 10**9),
)
