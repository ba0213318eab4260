"""safetensors dtype names, their item sizes, and their torch equivalents."""

from __future__ import annotations

import torch

from surgery.errors import SurgeryError

# safetensors name -> torch dtype. The item size comes from torch, so the two cannot disagree.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

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
    return TORCH_DTYPES[dtype].itemsize


def is_float(dtype: str) -> bool:
    """Whether tensors of this dtype may be averaged."""
    return dtype in FLOAT_DTYPES


def accumulator_for(dtype: str) -> torch.dtype:
    """The dtype blends of `dtype` inputs accumulate in: float32, or float64 for 32/64-bit inputs.

    float64 for float32 inputs keeps "soup of identical checkpoints is bit-identical" true: n*x and
    then /n are exact in float64 for float32 x, not always in float32.
    """
    return torch.float64 if itemsize(dtype) >= 4 else torch.float32


def parse_dtype(text: str) -> str:
    """Turn a user's --dtype (bf16, float16, fp32, ...) into a safetensors dtype name."""
    key = text.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    if text.strip().upper() in FLOAT_DTYPES:
        return text.strip().upper()
    choices = ", ".join(sorted({"bf16", "fp16", "fp32", "fp64"}))
    raise SurgeryError(f"unknown dtype {text!r}; choose one of {choices}")
