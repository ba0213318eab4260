"""karcher: the Karcher (Riemannian) mean of the inputs' directions on the unit hypersphere,
scaled by their mean norm, as mergekit's `karcher` (equal weights, `max_iter`, `tol`).

Every iterate of mergekit's fixed-point iteration is a linear combination of the unit vectors
x_i / |x_i|, and everything the iteration looks at (dot products, tangent norms) follows from
their Gram matrix. So one reduction pass (the Gram matrix of the inputs, in float64) is enough:
the iterations run on coefficient vectors of length N, and one map pass writes sum_i c_i x_i.
"""

from __future__ import annotations

import math

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.slerp import gram
from surgery.engine.plan import OutputTensor, copy_of


def _norm(coefs: np.ndarray, units: np.ndarray) -> float:
    """|sum_i coefs_i u_i| given the Gram matrix `units` of the u_i."""
    return math.sqrt(max(float(coefs @ units @ coefs), 0.0))


def _iterate(mean: np.ndarray, units: np.ndarray, alphas: np.ndarray, max_iter: int, tol: float):
    """mergekit's fixed-point iteration, on coefficients of the unit vectors."""
    identity = np.eye(len(alphas))
    for _ in range(max_iter):
        tangent = np.zeros_like(mean)
        dots = units @ mean  # u_i . mean
        for i, alpha in enumerate(alphas):
            dot = min(1.0, max(-1.0, float(dots[i])))
            theta = math.acos(dot)
            if theta < tol:
                continue
            tangent += alpha * (theta / math.sin(theta)) * (identity[i] - dot * mean)
        tangent_norm = _norm(tangent, units)
        if tangent_norm < tol:
            break
        mean = math.cos(tangent_norm) * mean + math.sin(tangent_norm) * (tangent / tangent_norm)
        length = _norm(mean, units)
        if length > tol:
            mean = mean / length
    return mean


def karcher_coefficients(g: np.ndarray, max_iter: int, tol: float) -> np.ndarray:
    """The c_i of the result sum_i c_i x_i, given the Gram matrix `g` of the inputs x_i."""
    count = len(g)
    norms = np.sqrt(np.maximum(np.diag(g), 0))
    alphas = np.full(count, 1 / count)
    valid = [i for i in range(count) if norms[i] > tol]
    if not valid:
        return np.zeros(count)
    inverse = np.where(norms > 0, 1 / np.where(norms > 0, norms, 1), 0.0)
    units = g[np.ix_(valid, valid)] * np.outer(inverse[valid], inverse[valid])
    weights = alphas[valid] / alphas[valid].sum()
    mean_norm = _norm(weights, units)
    first = np.eye(len(valid))[0]
    mean = first if mean_norm < tol else weights / mean_norm
    mean = _iterate(mean, units, weights, max_iter, tol)
    scale = float(alphas @ norms)
    result = np.zeros(count)
    result[valid] = scale * mean * inverse[valid]
    return result


class Karcher(Kernel):
    """sum_i c_i x_i: the Karcher mean direction times the mean norm."""

    def __init__(self, job: TensorJob) -> None:
        super().__init__(job.name, job.inputs, job.out_dtype)
        self.max_iter = int(job.shared["max_iter"])
        self.tol = float(job.shared["tol"])

    def prepare(self, inputs: Inputs) -> np.ndarray:
        """The coefficients, from the inputs' Gram matrix (one reduction pass)."""
        vectors = [lambda c, i=i: c[i] for i in range(len(self.inputs))]
        return karcher_coefficients(gram(inputs, vectors), self.max_iter, self.tol)

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """sum_i c_i x_i."""
        coefs = [inputs.work(c) for c in state]
        for start, chunk in inputs.chunks(part=part):
            result = chunk[0] * coefs[0]
            for vector, coef in zip(chunk[1:], coefs[1:], strict=True):
                vector *= coef
                result += vector
            out.put(start, result)


def build(job: TensorJob) -> OutputTensor:
    """One karcher tensor; the one input itself when a single model feeds it, as mergekit."""
    if len(job.inputs) == 1:
        return copy_of(job.inputs[0], job.out_dtype)
    return computed(Karcher(job), job.shape)


METHOD = Method(
    name="karcher",
    params=(
        Param("max_iter", Scope.SHARED, int, 10),
        Param("tol", Scope.SHARED, float, 1e-5),
    ),
    build=build,
)
