"""Reduction passes decode into reused arrays: the same sums bit for bit as fresh arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS, Inputs
from surgery.engine.ops.merge.slerp import DOT_BLOCK, dot, gram
from surgery.engine.reader import open_checkpoint
from surgery.engine.source import SourcePool

# Three chunks and a short one; every dtype the merge kernels decode.
NUMEL = 3 * CHUNK_ELEMENTS + 1000
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


@pytest.fixture(params=DTYPES, ids=str)
def inputs(request, tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(NUMEL, generator=gen).to(request.param) for i in range(4)}
    save_file(tensors, tmp_path / "model.safetensors")
    checkpoint = open_checkpoint(tmp_path / "model.safetensors")
    with SourcePool() as pool:
        work = np.float64 if request.param == torch.float64 else np.float32
        yield Inputs(pool, [checkpoint.tensors[f"w{i}"] for i in range(4)], work)


def test_reused_chunks_hold_the_same_values_in_the_same_arrays(inputs):
    fresh = [(start, [a.copy() for a in chunk]) for start, chunk in inputs.chunks()]
    reused, first = [], None
    for start, chunk in inputs.chunks(reuse=True):
        first = first or chunk
        assert all(np.shares_memory(a, b) for a, b in zip(chunk, first, strict=True))
        reused.append((start, [a.copy() for a in chunk]))
    assert [s for s, _ in reused] == [s for s, _ in fresh]
    for (_, got), (_, expected) in zip(reused, fresh, strict=True):
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == inputs.work and np.array_equal(g, e)


def test_gram_with_task_vectors_in_place_matches_fresh_arrays(inputs):
    in_place = [lambda c, i=i: np.subtract(c[i], c[0], out=c[i]) for i in (1, 2, 3)]
    got = gram(inputs, in_place)
    # The reference: fresh arrays, fresh task vectors, the same sums per chunk.
    expected = np.zeros((3, 3))
    for _, chunk in inputs.chunks():
        deltas = [chunk[i] - chunk[0] for i in (1, 2, 3)]
        for i in range(3):
            for j in range(3):
                expected[i, j] += dot(deltas[i], deltas[j])
    assert np.array_equal(got, expected)
    exact = np.stack([inputs.chunk(i, 0, NUMEL) - inputs.chunk(0, 0, NUMEL) for i in (1, 2, 3)])
    exact = exact.astype(np.float64)
    np.testing.assert_allclose(got, exact @ exact.T, rtol=1e-6)


@pytest.mark.parametrize("size", [1, DOT_BLOCK - 1, 3 * DOT_BLOCK, 2**17 + 77])
@pytest.mark.parametrize("offset", [0.0, 0.1])
def test_dot_sums_every_product_within_float32_rounding(size, offset):
    # Whole blocks and the tail after them (a dropped or doubled tail of 77 would be 1e-3 off);
    # within one float32 rounding of sum |a * b| of the float64 dot, which a pairwise sum of
    # the product array also keeps. Offset 0.1: products of one sign, where running sums drift.
    rng = np.random.default_rng(size)
    a, b = (rng.standard_normal(size).astype(np.float32) * 0.01 + offset for _ in range(2))
    exact = float(a.astype(np.float64) @ b.astype(np.float64))
    scale = float(np.abs(a.astype(np.float64) * b).sum())
    assert abs(dot(a, b) - exact) <= float(np.finfo(np.float32).eps) * scale
