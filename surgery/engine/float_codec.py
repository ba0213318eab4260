"""Float chunks as numpy arrays: decoded from safetensors bytes, encoded with one rounding.

numpy has no bfloat16, so bf16 is decoded by a shift (exact) and encoded by round-to-nearest-even
on the float32 bit pattern, as torch rounds. float64 values bound for a 16-bit dtype go through
float32 first, as torch converts them. Float8 dtypes are not handled here (the writer blends them
with torch).
"""

from __future__ import annotations

import numpy as np

NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16}
# The dtypes this module decodes and encodes.
CODEC_DTYPES = frozenset({*NUMPY, "BF16"})

# The smallest magnitude that rounds to infinity in each output dtype (half an ulp past the
# largest finite value, ties rounding to the even infinity): a finite accumulator below it in
# magnitude cannot overflow when rounded.
_OVERFLOW = {
    "BF16": float(np.array(0x7F7F8000, np.uint32).view(np.float32)),
    "F16": 65520.0,
    "F32": 2.0**128 - 2.0**103,
    "F64": float("inf"),
}


def decode(raw: memoryview, dtype: str, work: type[np.floating]) -> np.ndarray:
    """The values in `raw` (whole elements of `dtype`) as a new array of `work` floats."""
    if dtype == "BF16":
        wide = np.left_shift(np.frombuffer(raw, np.uint16), 16, dtype=np.uint32)
        values = wide.view(np.float32)
        return values if work is np.float32 else values.astype(work)
    return np.frombuffer(raw, NUMPY[dtype]).astype(work)


def decode_into(raw: memoryview, dtype: str, out: np.ndarray) -> np.ndarray:
    """The values in `raw` written into `out` (float32 or float64, as long as `raw`); no
    allocation when `out` is float32 or the input is not bf16."""
    if dtype == "BF16" and out.dtype == np.float32:
        np.left_shift(np.frombuffer(raw, np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    elif dtype == "BF16":
        np.copyto(out, decode(raw, dtype, np.float32))
    else:
        np.copyto(out, np.frombuffer(raw, NUMPY[dtype]))
    return out


def decode_split_into(raw: memoryview, out: np.ndarray) -> np.ndarray:
    """The bf16 values in `raw` (an even count) as float32 in `out`, in split order: the
    even-numbered elements in the first half, the odd-numbered in the second.

    Read as 32-bit words, each holding two bf16 values (little-endian: the even one in the low
    half), a shift and a mask decode both without numpy's uint16 -> uint32 cast: half the
    passes of `decode_into`. Elementwise arithmetic does not care about the order, and
    `encode_split` puts it back.
    """
    words = np.frombuffer(raw, np.uint32)
    half = len(words)
    np.left_shift(words, 16, out=out[:half].view(np.uint32))
    np.bitwise_and(words, 0xFFFF0000, out=out[half:].view(np.uint32))
    return out


def encode_split(values: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """float32 `values` in split order (see `decode_split_into`) rounded once to bf16 as
    `encode` rounds them, in the original order, as uint16 (a view of `scratch`, float32 as
    long as `values`). The caller knows every value is finite and below bf16's overflow
    threshold (`may_overflow` is false): no NaN to quiet, no carry past the sign bit.
    """
    bits, rounded = values.view(np.uint32), scratch.view(np.uint32)
    np.right_shift(bits, 16, out=rounded)  # round to nearest even: + 0x7FFF + the kept lsb
    np.bitwise_and(rounded, 1, out=rounded)
    np.add(rounded, bits, out=rounded)
    np.add(rounded, 0x7FFF, out=rounded)
    half = len(bits) // 2
    even, odd = rounded[:half], rounded[half:]
    np.right_shift(even, 16, out=even)  # each word: the even value low, the odd one high
    np.bitwise_and(odd, 0xFFFF0000, out=odd)
    np.bitwise_or(even, odd, out=even)
    return even.view(np.uint16)


def encode(values: np.ndarray, dtype: str, *, finite: bool = False) -> np.ndarray:
    """`values` rounded once to `dtype` (round to nearest even), as an array of that dtype's
    bits (uint16 for bf16); `finite` says the caller knows every value is finite (no NaN
    check)."""
    if dtype == "F64":
        return values.astype(np.float64, copy=False)
    # Values beyond the dtype's range become inf without numpy's warning lines: refusing an
    # overflow is the caller's check (`surgery.engine.blend.encode_checked`).
    with np.errstate(over="ignore", invalid="ignore"):
        single = values.astype(np.float32, copy=False)  # float64 -> 16 bits goes via float32
        if dtype != "BF16":
            return single.astype(NUMPY[dtype], copy=False)
    bits = single.view(np.uint32)
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits
    rounded >>= 16
    out = rounded.astype(np.uint16)
    if not (
        finite or _surely_finite(single)
    ):  # NaN would round to infinity or change sign: quiet NaN
        out[np.isnan(single)] = 0x7FC0
    return out


def _surely_finite(values: np.ndarray) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum just says "no"
        return bool(np.isfinite(np.add.reduce(values, dtype=values.dtype)))


def may_overflow(values: np.ndarray, dtype: str) -> bool:
    """Whether rounding `values` to `dtype` (as `encode` rounds them) might give an infinity or
    NaN: some value is not finite or lies at or beyond the dtype's overflow threshold. Two
    reductions, no allocation; False means the rounded values are surely finite."""
    if not len(values):
        return False
    limit = _OVERFLOW[dtype]
    low, high = np.minimum.reduce(values), np.maximum.reduce(values)
    if values.dtype == np.float64 and dtype in ("F16", "BF16"):
        # `encode` rounds float64 to float32 first, and the 16-bit threshold applies to that
        # float32 (65519.999 becomes 65520.0, then inf). Rounding is monotonic, so the rounded
        # extremes are the extremes of the rounded values.
        with np.errstate(over="ignore"):
            low, high = np.float32(low), np.float32(high)
    return not (-limit < low and high < limit)  # NaN compares false: "might"
