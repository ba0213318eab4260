"""FP8 weights stored with their scales: never blended or cast apart from them.

A quantized checkpoint (DeepSeek-V3, Qwen3-FP8: `quantization_config` with `weight_block_size`
[128, 128]) stores `X.weight` as F8_E4M3 values q and `X.weight_scale_inv` as float32 scales s,
one per block; the weight is q * s. Blending q and s apart is wrong: avg(q) * avg(s) is not
avg(q * s). With byte-identical scales it is exact: avg(q_i * s) = avg(q_i) * s, so the blend of
q, rounded once to FP8, is the true blend requantized with the shared scales. Anything else is
refused in one line, and so is `--dtype`, which would cast q without its scale.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from surgery.core.errors import MismatchError, SurgeryError
from surgery.engine.matching import Matching
from surgery.engine.plan import tensors_equal
from surgery.engine.reader import Checkpoint, TensorInfo
from surgery.engine.source import SourcePool

# Names of a weight's scale tensor: `X.weight_scale_inv` (DeepSeek-V3, Qwen3-FP8: multiply) and
# `X.weight_scale` (compressed-tensors, FBGEMM FP8).
SCALE_SUFFIXES = ("_scale_inv", "_scale")


def scale_of(checkpoint: Checkpoint, name: str) -> str | None:
    """The name of the scale tensor of the FP8 tensor `name`, if it is one and has a scale."""
    tensor = checkpoint.tensors.get(name)
    if tensor is None or not tensor.dtype.startswith("F8_"):
        return None
    return next((name + s for s in SCALE_SUFFIXES if name + s in checkpoint.tensors), None)


def weight_of(checkpoint: Checkpoint, name: str) -> str | None:
    """The FP8 weight whose scale tensor is `name`, if `name` is one."""
    for suffix in SCALE_SUFFIXES:
        weight = name.removesuffix(suffix)
        if weight != name and scale_of(checkpoint, weight) == name:
            return weight
    return None


def scale_pairs(checkpoint: Checkpoint) -> dict[str, str]:
    """Each FP8 tensor that has a scale tensor beside it -> the scale tensor's name."""
    pairs = {name: scale_of(checkpoint, name) for name in checkpoint.tensors}
    return {name: scale for name, scale in pairs.items() if scale is not None}


def refuse_cast(pairs: dict[str, str], dtype: str | None) -> None:
    """Refuse a `--dtype` (given: not None) for a checkpoint with FP8 scales (`scale_pairs`).

    Raises:
        SurgeryError: naming one scaled weight.
    """
    if dtype is None or not pairs:
        return
    weight, scale = next(iter(pairs.items()))
    raise SurgeryError(
        f"--dtype {dtype} would cast FP8 values without their scales ({weight!r} is scaled by "
        f"{scale!r}); this tool does not dequantize, so keep the checkpoint's dtypes"
    )


def check_scales(
    matching: Matching,
    labels: Sequence[str],
    pool: SourcePool,
    *,
    dtype: str | None,
    blended: Container[str],
) -> frozenset[str]:
    """Refuse what would treat an FP8 weight apart from its scale; return the scales' names.

    Args:
        matching: the inputs' tensors, matched (`surgery.engine.matching.match`).
        dtype: the `--dtype` asked for, if any: refused when the inputs have FP8 scales.
        blended: the names of the tensors the operation blends (soup: all; revert: none): the
            scale of each such weight must be byte-identical in every input.

    Returns:
        The names of the scale tensors (the first input's): the caller copies them from its
        first input, never blends them.

    Raises:
        SurgeryError: `dtype` given for a checkpoint with FP8 scales.
        MismatchError: a scale that differs between inputs of a blend.
    """
    pairs = scale_pairs(matching.checkpoints[0])
    refuse_cast(pairs, dtype)
    for weight, scale in pairs.items():
        if weight in blended or scale in blended:
            found = [matching.partner(scale, i) for i in range(len(matching.checkpoints))]
            scales = [t for t in found if t is not None]
            named = [label for t, label in zip(found, labels, strict=True) if t is not None]
            require_equal_scales(weight, scales, named, pool)
    return frozenset(pairs.values())


def require_equal_scales(
    weight: str, scales: Sequence[TensorInfo], labels: Sequence[str], pool: SourcePool
) -> None:
    """The scales of one FP8 weight in every input of a blend must be byte-identical.

    Raises:
        MismatchError: naming the weight and the first input that differs.
    """
    for other, label in zip(scales[1:], labels[1:], strict=True):
        if not tensors_equal(scales[0], other, pool):
            raise MismatchError(
                f"FP8 weight {weight!r} has different scales ({scales[0].name!r}) in "
                f"{labels[0]} and {label}: blending the values and the scales apart would not "
                "blend the weights; only FP8 checkpoints with identical scales are blended"
            )
