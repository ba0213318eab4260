"""The one dtype table: every dtype safetensors defines, its size, kind and torch equivalent.

Sizes are in bits, because safetensors also defines packed sub-byte dtypes (F4, F6_*): a tensor
of those must fill whole bytes (numel * bits divisible by 8), as safetensors' own loader
requires. Such tensors are read, inspected and copied byte for byte; they are never decoded.

torch is imported only when a torch dtype is asked for: copies (revert, alpha 0 or 1), inspect
and verify never need it, and start faster without it.

Every multi-byte value in a safetensors file is little-endian. The engine decodes and encodes
values with numpy and torch in the host's byte order (`torch.frombuffer` has no other), so it
runs only on a little-endian host (`require_little_endian`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from surgery.core.errors import SurgeryError

# The byte order values are decoded in (a name tests can set to "big").
HOST_BYTE_ORDER = sys.byteorder

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Dtype:
    """One safetensors dtype.

    Attributes:
        bits: bits per element (4 and 6 for the packed F4 and F6 formats).
        kind: "float", "int", "bool" or "complex".
        torch_name: the torch dtype of one element; None when torch has none (F4 and F6: torch's
            float4_e2m1fn_x2 holds two values per element, so shapes would not match).
        blendable: whether the engine averages tensors of this dtype (see `is_float`).
    """

    bits: int
    kind: str
    torch_name: str | None
    blendable: bool = False


# Every dtype of safetensors 0.8 (its Rust `Dtype` enum), in that enum's order.
DTYPES: dict[str, Dtype] = {
    "BOOL": Dtype(8, "bool", "bool"),
    "F4": Dtype(4, "float", None),  # E2M1, two per byte
    "F6_E2M3": Dtype(6, "float", None),  # four per three bytes
    "F6_E3M2": Dtype(6, "float", None),
    "U8": Dtype(8, "int", "uint8"),
    "I8": Dtype(8, "int", "int8"),
    "F8_E5M2": Dtype(8, "float", "float8_e5m2", blendable=True),
    "F8_E4M3": Dtype(8, "float", "float8_e4m3fn", blendable=True),
    "F8_E8M0": Dtype(8, "float", "float8_e8m0fnu"),  # exponent-only block scales (MX formats)
    "F8_E4M3FNUZ": Dtype(8, "float", "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": Dtype(8, "float", "float8_e5m2fnuz"),
    "I16": Dtype(16, "int", "int16"),
    "U16": Dtype(16, "int", "uint16"),
    "F16": Dtype(16, "float", "float16", blendable=True),
    "BF16": Dtype(16, "float", "bfloat16", blendable=True),
    "I32": Dtype(32, "int", "int32"),
    "U32": Dtype(32, "int", "uint32"),
    "F32": Dtype(32, "float", "float32", blendable=True),
    "C64": Dtype(64, "complex", "complex64"),
    "F64": Dtype(64, "float", "float64", blendable=True),
    "I64": Dtype(64, "int", "int64"),
    "U64": Dtype(64, "int", "uint64"),
}

# Dtypes a model's weights can be loaded, trained and scored in.
COMPUTE_DTYPES = ("F32", "BF16", "F16", "F64")

# What users type for --dtype -> safetensors name.
_ALIASES = {
    "bf16": "BF16",
    "bfloat16": "BF16",
    "fp16": "F16",
    "f16": "F16",
    "float16": "F16",
    "half": "F16",
    "fp32": "F32",
    "f32": "F32",
    "float32": "F32",
    "float": "F32",
    "fp64": "F64",
    "float64": "F64",
}

# safetensors name -> the string transformers writes as `dtype` in config.json.
CONFIG_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def require_little_endian() -> None:
    """Refuse a big-endian host, where every decoded value would have its bytes reversed.

    Raises:
        SurgeryError: the host is big-endian.
    """
    if HOST_BYTE_ORDER != "little":
        raise SurgeryError(
            "this host is big-endian: safetensors values are little-endian and the engine "
            "decodes them in the host's byte order; run on a little-endian host"
        )


def is_known(dtype: str) -> bool:
    """Whether `dtype` is a safetensors dtype name."""
    return dtype in DTYPES


def bits(dtype: str) -> int:
    """Bits per element of a safetensors dtype name."""
    return DTYPES[dtype].bits


def nbytes(dtype: str, numel: int) -> int:
    """Bytes of `numel` elements of `dtype`.

    Raises:
        ValueError: packed elements that do not fill whole bytes (the reader refuses such
            tensors before anything asks).
    """
    total = numel * DTYPES[dtype].bits
    if total % 8:
        raise ValueError(f"{numel} elements of {dtype} do not fill whole bytes")
    return total // 8


def itemsize(dtype: str) -> int:
    """Bytes per element of a safetensors dtype name.

    Raises:
        SurgeryError: a packed dtype (F4, F6_*), whose elements are smaller than a byte.
    """
    size = DTYPES[dtype].bits
    if size % 8:
        raise SurgeryError(f"{dtype} packs {size}-bit elements; it has no whole-byte item size")
    return size // 8


@cache
def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (imports torch on first use).

    Raises:
        SurgeryError: a dtype torch cannot hold element for element (F4, F6_*).
    """
    import torch

    name = DTYPES[dtype].torch_name
    if name is None or not hasattr(torch, name):
        raise SurgeryError(
            f"{dtype} tensors can be copied but not decoded: torch has no {dtype} dtype"
        )
    return getattr(torch, name)


# The dtypes the engine averages: real floats torch can widen to float32 and round back to.
# Everything else (integers, bool, complex, packed and scale formats, and for now the FNUZ FP8
# variants) is only copied, and a blend requires it to be identical in every input.
FLOAT_DTYPES = frozenset(name for name, info in DTYPES.items() if info.blendable)


def is_float(dtype: str) -> bool:
    """Whether tensors of this dtype may be averaged."""
    return dtype in FLOAT_DTYPES


def accumulator_for(dtype: str) -> str:
    """The dtype blends of `dtype` inputs accumulate in: float32, or float64 for 32/64-bit inputs.

    float64 for float32 inputs keeps "soup of identical checkpoints is bit-identical" true: n*x and
    then /n are exact in float64 for float32 x, not always in float32.
    """
    return "F64" if bits(dtype) >= 32 else "F32"


def compute_dtype(text: str) -> str | None:
    """The safetensors name of a dtype a model can compute in (`COMPUTE_DTYPES`) from a user's
    name (bf16, float32, ...); None for any other, which the caller refuses in its own words."""
    try:
        name = parse_dtype(text)
    except SurgeryError:
        return None
    return name if name in COMPUTE_DTYPES else None


def parse_dtype(text: str) -> str:
    """Turn a user's --dtype (bf16, float16, fp32, ...) into a safetensors dtype name.

    Raises:
        SurgeryError: not a dtype the engine can blend into.
    """
    key = text.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    if text.strip().upper() in FLOAT_DTYPES:
        return text.strip().upper()
    choices = ", ".join(sorted({"bf16", "fp16", "fp32", "fp64"}))
    raise SurgeryError(f"unknown dtype {text!r}; choose one of {choices}")
