"""safetensors dtype names, their item sizes, and their torch equivalents.

torch is imported only when a torch dtype is asked for: copies (revert, alpha 0 or 1), inspect
and verify never need it, and start faster without it.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from surgery.core.errors import SurgeryError

if TYPE_CHECKING:
    import torch

# safetensors name -> bytes per element.
ITEMSIZES: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}

# safetensors name -> name of the torch dtype.
_TORCH_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


@cache
def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (imports torch on first use)."""
    import torch

    return getattr(torch, _TORCH_NAMES[dtype])


FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})

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


def itemsize(dtype: str) -> int:
    """Bytes per element of a safetensors dtype name."""
    return ITEMSIZES[dtype]


def is_float(dtype: str) -> bool:
    """Whether tensors of this dtype may be averaged."""
    return dtype in FLOAT_DTYPES


def accumulator_for(dtype: str) -> str:
    """The dtype blends of `dtype` inputs accumulate in: float32, or float64 for 32/64-bit inputs.

    float64 for float32 inputs keeps "soup of identical checkpoints is bit-identical" true: n*x and
    then /n are exact in float64 for float32 x, not always in float32.
    """
    return "F64" if itemsize(dtype) >= 4 else "F32"


def parse_dtype(text: str) -> str:
    """Turn a user's --dtype (bf16, float16, fp32, ...) into a safetensors dtype name."""
    key = text.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    if text.strip().upper() in FLOAT_DTYPES:
        return text.strip().upper()
    choices = ", ".join(sorted({"bf16", "fp16", "fp32", "fp64"}))
    raise SurgeryError(f"unknown dtype {text!r}; choose one of {choices}")
