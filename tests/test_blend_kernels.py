"""The writer's numpy blend and the in-memory torch blend agree bit for bit.

Sweeps and localize blend in memory with torch (`accumulate`, `finish`); the streaming writer
blends with numpy (`ChunkBlender`). A sweep point's score must be the score of the checkpoint
`interpolate` writes, so the two must give the same bits for every dtype pair, weight and divisor.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from surgery.core.dtypes import torch_dtype
from surgery.core.errors import SurgeryError
from surgery.engine import blend
from surgery.engine.blend import ChunkBlender, accumulate, accumulator_dtype, check_finite, finish

DTYPES = ["BF16", "F16", "F32", "F64"]


def _values(dtype: str, seed: int, n: int = 5000) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=generator, dtype=torch.float64) * 3
    values[:50] *= 1e-30  # subnormals and tiny values round differently if anything is off
    return values.to(torch_dtype(dtype))


def _raw(values: torch.Tensor) -> memoryview:
    return memoryview(values.view(torch.uint8).numpy()).cast("B")


def _torch_blend(inputs, weights, divisor, out_dtype):
    out = torch.empty(len(inputs[0][1]), dtype=torch_dtype(out_dtype))
    pairs = [(values, w) for (_, values), w in zip(inputs, weights, strict=True)]
    acc = torch.empty(len(out), dtype=accumulator_dtype(out_dtype, [d for d, _ in inputs]))
    return finish(accumulate(acc, pairs), divisor, out)


@pytest.mark.parametrize(
    ("in_dtypes", "out_dtype"),
    [
        *(((d, d), d) for d in DTYPES),
        (("BF16", "F16"), "BF16"),
        (("F32", "BF16"), "BF16"),
        (("BF16", "BF16", "BF16"), "F16"),
        (("F64", "F32"), "F16"),
        (("F32", "F32"), "BF16"),
    ],
)
@pytest.mark.parametrize(
    ("weights", "divisor"),
    [
        ((1.0, 1.0, 1.0), 3.0),
        ((0.7, 0.3, 0.0), 1.0),
        ((-0.35, 1.35, 0.2), 1.0),
        ((2.5, 1e-3, 1.0), 1.7),
    ],
)
def test_numpy_blend_is_the_torch_blend(in_dtypes, out_dtype, weights, divisor, monkeypatch):
    monkeypatch.setattr(blend, "_WIDE_STEP", 777)  # torch's float64 products in several slices
    inputs = [(d, _values(d, seed)) for seed, d in enumerate(in_dtypes)]
    weights = weights[: len(inputs)]
    expected = _torch_blend(inputs, weights, divisor, out_dtype)
    tensor = SimpleNamespace(name="w", dtype=out_dtype)
    chunks = [(_raw(values), d, w) for (d, values), w in zip(inputs, weights, strict=True)]
    got = ChunkBlender().blend(tensor, chunks, divisor)
    assert np.array_equal(
        np.frombuffer(memoryview(got).cast("B"), np.uint8),
        expected.view(torch.uint8).numpy(),
    ), f"{np.count_nonzero(got.view(np.uint8) != expected.view(torch.uint8).numpy())} bytes differ"


def _refused(check, *args) -> bool:
    try:
        check(*args)
    except SurgeryError as error:
        assert "'w': 300 value(s) overflow" in str(error) or "'w': 299 value(s)" in str(error)
        return True
    return False


@pytest.mark.parametrize("out_dtype", ["BF16", "F16"])
def test_both_blends_refuse_the_same_overflow_and_pass_input_nans(out_dtype):
    big = torch.full((300,), 4e4 if out_dtype == "F16" else 3e38, dtype=torch.float32)
    nan = big.clone()
    nan[7] = float("nan")
    tensor = SimpleNamespace(name="w", dtype=out_dtype)
    for values, refused in ((big, True), (nan, True), (big / 4, False)):
        pairs = [(values, 1.0), (values, 1.0)]
        chunks = [(_raw(values), "F32", 1.0)] * 2
        out = torch.empty(300, dtype=torch_dtype(out_dtype))
        acc = finish(accumulate(torch.empty(300, dtype=torch.float64), pairs), 1.0, out)
        outcomes = [
            _refused(check_finite, tensor, acc, pairs),
            _refused(ChunkBlender().blend, tensor, chunks, 1.0),
        ]
        assert outcomes == [refused, refused]
    only_nan = torch.full((300,), float("nan"))
    chunk = [(_raw(only_nan), "F32", 1.0)]
    got = ChunkBlender().blend(tensor, chunk, 1.0)  # NaN in the input passes through
    assert (
        np.isnan(np.frombuffer(got.tobytes(), np.float16)).all()
        if out_dtype == "F16"
        else (got == 0x7FC0).all()
    )


def test_chunk_blender_reuses_its_buffers_across_sizes():
    blender = ChunkBlender()
    tensor = SimpleNamespace(name="w", dtype="BF16")
    for n in (1000, 10, 1000, 1):
        values = _values("BF16", n, n)
        got = blender.blend(tensor, [(_raw(values), "BF16", 1.0)] * 2, 2.0)
        assert np.array_equal(got, values.view(torch.int16).numpy().view(np.uint16))
    assert len(blender._buffers) == 2 and all(len(b) == 1000 for b in blender._buffers.values())


def test_bf16_blends_in_split_order_refuse_overflow_and_pass_nans_as_the_plain_order():
    """bf16 to bf16 blends of an even count run in split order (`decode_split_into`); near
    bf16's limit, or with NaN in an input, they give what the plain order (an odd count) gives."""
    tensor = SimpleNamespace(name="w", dtype="BF16")
    big = torch.full((4999,), 3e38, dtype=torch.bfloat16)
    big[::7] = -3e38
    values = _values("BF16", 5, 4999)
    nan = values.clone()
    nan[3] = float("nan")
    assert _refused(ChunkBlender().blend, tensor, [(_raw(big[:300]), "BF16", 1.0)] * 2, 1.0)
    for inputs, weights, divisor in (
        ([nan, values], (1.0, 1.0), 2.0),
        ([big, values], (0.5, 0.5), 1.0),
        ([values, big, values], (1.0, 0.25, 1.0), 1.5),
    ):
        pairs = list(zip(inputs, weights, strict=True))
        blends = [
            ChunkBlender().blend(tensor, [(_raw(v[:n]), "BF16", w) for v, w in pairs], divisor)
            for n in (4998, 4999)  # split order, plain order
        ]
        assert np.array_equal(blends[0], blends[1][:4998])
        assert (blends[1][3] == 0x7FC0) == (inputs[0] is nan)
