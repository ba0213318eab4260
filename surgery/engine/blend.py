"""The one blending kernel, shared by the streaming writer and in-memory sweeps.

Both paths run exactly these operations in this order, so a blend computed in memory is bit for
bit the blend a written checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from surgery.core.dtypes import accumulator_for, itemsize, torch_dtype
from surgery.core.errors import SurgeryError

if TYPE_CHECKING:
    import torch


def accumulator_dtype(out_dtype: str, source_dtypes: Iterable[str]) -> torch.dtype:
    """The widest accumulator any of the dtypes involved needs (safetensors dtype names)."""
    candidates = [accumulator_for(out_dtype), *(accumulator_for(d) for d in source_dtypes)]
    return torch_dtype(max(candidates, key=itemsize))


def accumulate(acc: torch.Tensor, inputs: Sequence[tuple[torch.Tensor, float]]) -> torch.Tensor:
    """acc <- sum(weight * values), in acc's dtype (float32 or float64).

    Args:
        acc: the accumulator, shaped like every `values`; overwritten.
        inputs: (values, weight) pairs; values of any float dtype.

    Returns:
        `acc`, for chaining.
    """
    for position, (values, weight) in enumerate(inputs):
        if position == 0:
            # Convert first, then scale: torch.mul(values, w, out=acc) would multiply in the
            # input's 16-bit dtype and only then widen. A weight of 1 needs no pass at all.
            acc.copy_(values)
            if weight != 1.0:
                acc.mul_(weight)
        else:
            if values.element_size() == 1:  # float8: torch will not promote it in add_
                values = values.to(acc.dtype)
            acc.add_(values, alpha=weight)  # promotes to the accumulator dtype
    return acc


def finish(acc: torch.Tensor, divisor: float, out: torch.Tensor) -> torch.Tensor:
    """out <- acc / divisor, rounded once to out's dtype (the division itself in acc's dtype).

    One fused pass: torch computes the quotient in the accumulator's dtype and rounds it on
    store, bit for bit what dividing in place and then converting gives.
    """
    if divisor == 1.0:
        return out.copy_(acc)
    import torch

    return torch.div(acc, divisor, out=out)


def _finite(values: torch.Tensor) -> torch.Tensor:
    import torch

    # torch has no isfinite for float8; widening is exact.
    return torch.isfinite(values.float() if values.element_size() == 1 else values)


def check_finite(
    tensor: object, out: torch.Tensor, inputs: Sequence[tuple[torch.Tensor, float]]
) -> None:
    """Refuse a rounded chunk holding inf or NaN where every input value was finite.

    That is an overflow (huge weights or alphas, or a narrowing --dtype such as fp16 on values
    beyond 65504), never what the user meant. Non-finite values already in an input pass
    through unchanged (`surgery verify --values` reports them). Costs one isfinite pass per chunk;
    the per-input pass runs only when the output has a non-finite value.

    Args:
        tensor: the output tensor being written (its `name` and `dtype` go in the message).
        out: the rounded chunk.
        inputs: the chunk's (values, weight) pairs.

    Raises:
        SurgeryError: naming the tensor, the count and the output dtype.
    """
    finite = _finite(out)
    if bool(finite.all()):
        return
    new = ~finite
    for values, _ in inputs:
        new &= _finite(values)
    count = int(new.sum())
    if count:
        raise SurgeryError(
            f"{tensor.name!r}: {count} value(s) overflow {tensor.dtype} (inf or NaN from finite "
            "inputs); choose a wider --dtype or smaller weights/alphas"
        )
