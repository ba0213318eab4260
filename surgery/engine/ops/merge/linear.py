"""linear: sum(w_i * x_i), divided by sum(w_i) when `normalize` (the default).

The same weighted sum as `surgery soup` and `interpolate` (they are shortcuts of it): float32
accumulation (float64 for 32-bit inputs) and one rounding, bit for bit.
"""

from __future__ import annotations

from surgery.engine.ops.merge.method import Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.plan import OutputTensor, Source, blend_of, copy_of


def weight_divisor(job: TensorJob) -> float:
    """sum(w_i) when `normalize`, else 1.

    Raises:
        MergeConfigError: the weights sum to 0 under `normalize`.
    """
    weights = [float(p["weight"]) for p in job.per_input]
    total = sum(weights) if job.shared["normalize"] else 1.0
    if total == 0:
        raise MergeConfigError(f"linear: the weights of {job.name!r} sum to 0; cannot normalize")
    return total


def build(job: TensorJob) -> OutputTensor:
    """The weighted sum of the inputs, one tensor."""
    weights = [float(p["weight"]) for p in job.per_input]
    divisor = weight_divisor(job)
    sources = [Source(t, w) for t, w in zip(job.inputs, weights, strict=True) if w]
    if not sources:  # every weight 0 and no normalization: zeros, as 0 * x
        sources = [Source(job.inputs[0], 0.0)]
    tensor = blend_of(sources, job.out_dtype, divisor=divisor)
    return copy_of(sources[0].tensor, job.out_dtype) if tensor.is_copy else tensor


METHOD = Method(
    name="linear",
    params=(
        Param("weight", Scope.INPUT),
        Param("normalize", Scope.SHARED, bool, True),
    ),
    build=build,
)
