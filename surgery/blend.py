"""The one blending kernel, shared by the streaming writer and in-memory sweeps.

Both paths run exactly these operations in this order, so a blend computed in memory is bit for
bit the blend a written checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from surgery.dtypes import accumulator_for


def accumulator_dtype(out_dtype: str, source_dtypes: Iterable[str]) -> torch.dtype:
    """The widest accumulator any of the dtypes involved needs (safetensors dtype names)."""
    candidates = [accumulator_for(out_dtype), *(accumulator_for(d) for d in source_dtypes)]
    return max(candidates, key=lambda dtype: dtype.itemsize)


def accumulate(
    acc: torch.Tensor, inputs: Sequence[tuple[torch.Tensor, float]], divisor: float
) -> torch.Tensor:
    """acc <- sum(weight * values) / divisor, in acc's dtype (float32 or float64).

    Args:
        acc: the accumulator, shaped like every `values`; overwritten.
        inputs: (values, weight) pairs; values of any float dtype.
        divisor: what the weighted sum is divided by (1 for interpolation).

    Returns:
        `acc`, for chaining.
    """
    for position, (values, weight) in enumerate(inputs):
        if position == 0:
            # Convert first, then scale: torch.mul(values, w, out=acc) would multiply in the
            # input's 16-bit dtype and only then widen.
            acc.copy_(values).mul_(weight)
        else:
            acc.add_(values, alpha=weight)  # promotes to the accumulator dtype
    if divisor != 1.0:
        acc.div_(divisor)
    return acc
