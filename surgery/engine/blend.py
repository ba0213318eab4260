"""The blending kernel: acc = sum(w_i * x_i) in float32 (float64 for 32-bit inputs), divided
and rounded once.

Two implementations of the same operations in the same order: numpy for the streaming writer
(no torch import: a soup starts in a fraction of a second) and torch for in-memory sweeps on any
device (and the writer's float8 blends); `tests/test_blend_kernels.py` holds them bit for bit
equal, so a blend computed in memory is the blend a written checkpoint holds.

Each weighted addition to a float32 accumulator is a fused multiply-add, as mergekit's
`addcmul_` computes it: the product of a 16-bit value and a float32 weight is exact in float64,
so it is added there and rounded once to float32 (numpy has no fused multiply-add; float64 holds
the exact sum unless the two magnitudes differ by more than 2**18). A float64 accumulator (32-bit
inputs) rounds the product before adding it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from surgery.core.dtypes import accumulator_for, itemsize, torch_dtype
from surgery.core.errors import SurgeryError
from surgery.engine.float_codec import (
    NUMPY,
    decode,
    decode_into,
    decode_split_into,
    encode,
    encode_split,
    may_overflow,
)

if TYPE_CHECKING:
    import torch


def accumulator_name(out_dtype: str, source_dtypes: Iterable[str]) -> str:
    """The widest accumulator any of the dtypes involved needs: F32 or F64 (safetensors names)."""
    candidates = [accumulator_for(out_dtype), *(accumulator_for(d) for d in source_dtypes)]
    return max(candidates, key=itemsize)


def accumulator_dtype(out_dtype: str, source_dtypes: Iterable[str]) -> torch.dtype:
    """`accumulator_name` as a torch dtype."""
    return torch_dtype(accumulator_name(out_dtype, source_dtypes))


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
        elif weight == 1.0 and values.element_size() > 1:
            acc.add_(values)  # promotes to the accumulator dtype
        elif acc.dtype == torch_dtype("F32"):
            _fused_add(acc.view(-1), values.reshape(-1), _single(weight))
        else:
            acc.add_(values.to(acc.dtype, copy=True).mul_(weight))
    return acc


# Elements widened to float64 at a time by `_fused_add`: an 8 MB temporary, however large the
# parameter (a whole 670M-element embedding in float64 would take 5.4 GB).
_WIDE_STEP = 2**20


def _fused_add(acc: torch.Tensor, values: torch.Tensor, weight: float) -> None:
    """acc += weight * values with one rounding: the numpy kernel's float64 operations, in
    slices so the float64 temporary stays small."""
    for start in range(0, acc.numel(), _WIDE_STEP):
        part = acc[start : start + _WIDE_STEP]
        wide = values[start : start + _WIDE_STEP].to(torch_dtype("F64")).mul_(weight)
        part.copy_(wide.add_(part))


def _single(weight: float) -> float:
    """`weight` rounded to float32, as torch rounds a scalar applied to float32 values."""
    return float(np.float32(weight))


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


def _sum_is_finite(values: torch.Tensor) -> bool:
    import torch

    if values.element_size() == 1:  # float8: torch cannot sum it; widen (exact)
        values = values.float()
    wide = torch.float64 if values.dtype == torch.float64 else torch.float32
    return bool(torch.sum(values, dtype=wide).isfinite())


def check_finite(
    tensor: object, out: torch.Tensor, inputs: Sequence[tuple[torch.Tensor, float]]
) -> None:
    """Refuse a rounded chunk holding inf or NaN where every input value was finite.

    That is an overflow (huge weights or alphas, or a narrowing --dtype such as fp16 on values
    beyond 65504), never what the user meant. Non-finite values already in an input pass
    through unchanged (`surgery verify --values` reports them). Costs one float32 sum per chunk
    (a sum of finite values is finite unless it overflows, and any inf or NaN makes it
    non-finite), 17x cheaper than torch's isfinite on 16-bit floats; the exact per-element
    passes run only when the sum is not finite.

    Args:
        tensor: the output tensor being written (its `name` and `dtype` go in the message).
        out: the rounded chunk.
        inputs: the chunk's (values, weight) pairs.

    Raises:
        SurgeryError: naming the tensor, the count and the output dtype.
    """
    if _sum_is_finite(out):
        return
    finite = _finite(out)
    if bool(finite.all()):
        return
    new = ~finite
    for values, _ in inputs:
        new &= _finite(values)
    _refuse_overflow(tensor, int(new.sum()))


class ChunkBlender:
    """The numpy blend of one chunk, bit for bit `accumulate` then `finish` and `check_finite`;
    one per worker thread (it owns two chunk-sized buffers)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, type], np.ndarray] = {}

    def blend(
        self, tensor: object, chunks: Sequence[tuple[memoryview, str, float]], divisor: float
    ) -> np.ndarray:
        """One chunk of `tensor` (an output tensor: `name`, `dtype`) from its inputs' bytes.

        Args:
            chunks: (bytes, safetensors dtype, weight) of each input, same element count.
            divisor: what the weighted sum is divided by.

        Returns:
            The chunk rounded once to `tensor.dtype`, as an array of its bytes' dtype; it may
            be a view of this blender's buffers, valid until the next call.

        Raises:
            SurgeryError: the rounded chunk has inf or NaN where every input was finite.
        """
        work = NUMPY[accumulator_name(tensor.dtype, (dtype for _, dtype, _ in chunks))]
        count = len(chunks[0][0]) // itemsize(chunks[0][1])
        # bf16 to bf16 (the usual merge) runs in split order (`decode_split_into`): fewer passes.
        split = work is np.float32 and count % 2 == 0 and tensor.dtype == "BF16"
        split = split and all(dtype == "BF16" for _, dtype, _ in chunks)
        acc = self._quotient(chunks, divisor, work, count, split)
        if split and not may_overflow(acc, "BF16"):
            return encode_split(acc, self._buffer("scratch", work, count))
        if split:  # near bf16's limit: again in plain order, where `encode_checked` counts
            acc = self._quotient(chunks, divisor, work, count, split=False)
        inputs = lambda: (decode(raw, dtype, np.float64) for raw, dtype, _ in chunks)  # noqa: E731
        return encode_checked(tensor, acc, inputs)

    def _quotient(
        self,
        chunks: Sequence[tuple[memoryview, str, float]],
        divisor: float,
        work: type,
        count: int,
        split: bool,
    ) -> np.ndarray:
        """sum(w_i * x_i) / divisor in `work` floats, in split order when `split`."""
        acc, scratch = self._buffer("acc", work, count), self._buffer("scratch", work, count)
        for position, (raw, dtype, weight) in enumerate(chunks):
            into = acc if position == 0 else scratch
            values = decode_split_into(raw, into) if split else decode_into(raw, dtype, into)
            if position == 0 and weight != 1.0:
                values *= work(weight)
            elif position and (weight == 1.0 or work is np.float64):
                if weight != 1.0:
                    values *= weight
                acc += values
            elif position:  # acc + w * x with one rounding (see the module's docstring)
                wide = self._buffer("wide", np.float64, count)
                np.multiply(values, np.float64(_single(weight)), out=wide)  # exact
                wide += acc
                acc[:] = wide
        if divisor != 1.0:
            acc /= work(divisor)
        return acc

    def _buffer(self, role: str, work: type, count: int) -> np.ndarray:
        buffer = self._buffers.get((role, work))
        if buffer is None or len(buffer) < count:
            buffer = self._buffers[role, work] = np.empty(count, work)
        return buffer[:count]


def encode_checked(
    tensor: object, values: np.ndarray, inputs: Callable[[], Iterable[np.ndarray]]
) -> np.ndarray:
    """`values` (a float32 or float64 chunk of `tensor`) rounded once to `tensor.dtype` by
    `encode`, refusing inf or NaN where every input value was finite: `check_finite`'s rule for
    numpy chunks, shared by the blends and the merge kernels.

    Args:
        tensor: the output tensor being written (its `name` and `dtype` go in the message).
        values: the chunk's result before its one rounding.
        inputs: gives the chunk's input values (arrays as long as `values`); called only when
            the rounded chunk is not finite.

    Returns:
        The rounded chunk, as an array of its bytes' dtype (`encode`'s).

    Raises:
        SurgeryError: the rounded chunk has inf or NaN where every input was finite.
    """
    if not may_overflow(values, tensor.dtype):
        return encode(values, tensor.dtype, finite=True)
    out = encode(values, tensor.dtype)
    # Count in the encoded bytes: what the file will hold, whatever rounding led there.
    new = ~np.isfinite(decode(memoryview(out).cast("B"), tensor.dtype, np.float64))
    if new.any():
        for array in inputs():
            new &= np.isfinite(array)
        _refuse_overflow(tensor, int(new.sum()))
    return out


def _refuse_overflow(tensor: object, count: int) -> None:
    if count:
        raise SurgeryError(
            f"{tensor.name!r}: {count} value(s) overflow {tensor.dtype} (inf or NaN from finite "
            "inputs); choose a wider output dtype (--dtype, a merge's out_dtype) or smaller "
            "weights/alphas"
        )
