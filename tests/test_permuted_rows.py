"""Permuted vocabulary rows, gathered a chunk at a time, equal the mean computed one row at a
time in torch (each step rounded to the tensor's dtype, as mergekit computes it), bit for bit:
copies, zeros, means over every set of models, rows from an input of another dtype, -0.0 rows,
padding; from local mappings and from streamed sources; in chunks that cut rows."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from surgery.core.dtypes import torch_dtype
from surgery.engine.ops.merge.vocabulary import PAD, VocabularyMap, permuted
from surgery.engine.reader import open_checkpoint
from surgery.engine.source import LocalFile, SourcePool
from surgery.engine.values import element_bytes

ROWS, WIDTH = 40, 24
DTYPES = ["BF16", "F16", "F32"]


def _takes() -> list:
    """Model 0's output rows: its own rows (runs of them), zeros, another model's row, means of
    two and three models in every combination, a mean twice over one row, then padding."""
    takes = [((0, r),) for r in range(10)]  # a run of copies
    takes += [(), ((1, 5),), ((2, 7),), ((0, 3),), ((1, 39),)]
    takes += [((0, 11), (1, 12)), ((1, 13), (2, 14)), ((0, 15), (2, 16)), ((0, 0), (1, 0))]
    takes += [((0, 17), (1, 18), (2, 19)), ((0, 20), (1, 20), (2, 20)), ((1, 21), (1, 21))]
    takes += [((0, r), (1, r)) for r in range(22, 30)]  # -0.0 rows among them (see _inputs)
    takes += [((0, 30),), ((0, 31),), ((2, 32), (0, 33))]
    return takes + [PAD] * 5


def _reference(tensors: list[torch.Tensor], takes: list, dtype: torch.dtype) -> torch.Tensor:
    """One row at a time: sum from zeros in `dtype`, divide once; padding: the float64 mean."""

    def row(take) -> torch.Tensor:
        if not take:
            return torch.zeros(WIDTH, dtype=dtype)
        if len(take) == 1:
            return tensors[take[0][0]][take[0][1]].to(dtype)
        total = torch.zeros(WIDTH, dtype=dtype)
        for model, source in take:
            total = total + tensors[model][source].to(dtype)
        return total / len(take)

    rows = [row(t) for t in takes if t is not PAD]
    total = torch.zeros(WIDTH, dtype=torch.float64)
    for values in rows:
        total += values.to(torch.float32 if dtype != torch.float64 else dtype).double()
    pad = (total / len(rows)).float().to(dtype)
    return torch.stack(rows + [pad] * (len(takes) - len(rows)))


def _inputs(folder: Path, dtype: str, other: str) -> list[torch.Tensor]:
    """Three models' vocabulary tensors (model 2 in `other`); rows 22..29 of models 0 and 1 hold
    -0.0 in some columns (a sum from zeros turns them to +0.0, as torch's does)."""
    gen = torch.Generator().manual_seed(7)
    tensors = []
    for model in range(3):
        values = torch.randn(ROWS, WIDTH, generator=gen)
        if model < 2:
            values[22:30, ::3] = -0.0
        tensors.append(values.to(torch_dtype(other if model == 2 else dtype)))
    for model, values in enumerate(tensors):
        save_file({"embed.weight": values}, folder / f"m{model}.safetensors")
    return tensors


class _Streamed:
    """A local file seen as a source without a mapping (as a Hub file read by ranges)."""

    def __init__(self, path: Path) -> None:
        self.local = LocalFile(path)
        self.size = self.local.size

    def view(self, offset: int, nbytes: int) -> memoryview:
        return memoryview(bytearray(self.local.view(offset, nbytes)))

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.local.read_into(offset, buffer)

    def close(self) -> None:
        self.local.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["mapped", "streamed"])
@pytest.mark.parametrize("other", ["same", "F32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gathered_rows_equal_the_one_row_mean(tmp_path, dtype, other, streamed):
    other = dtype if other == "same" else other
    tensors = _inputs(tmp_path, dtype, other)
    paths = [tmp_path / f"m{m}.safetensors" for m in range(3)]
    columns = tuple(open_checkpoint(p).tensors["embed.weight"] for p in paths)
    takes = _takes()
    vocabulary = VocabularyMap((tuple(takes),) * 3, len(takes), len(takes) - 5)
    tensor = permuted(0, columns, vocabulary, dtype)
    expected = _reference(tensors, takes, torch_dtype(dtype)).contiguous()
    openers = {p: (lambda p=p: _Streamed(p)) for p in paths} if streamed else None
    numel = len(takes) * WIDTH
    # Chunks that start and end inside rows, of several sizes, and the whole tensor at once.
    bounds = [0, 5, WIDTH * 3 + 1, WIDTH * 15 - 7, WIDTH * 30, numel - WIDTH - 3, numel]
    with SourcePool(openers) as pool:
        rows = element_bytes(pool, tensor)
        parts = [bytes(rows[a:b]) for a, b in itertools.pairwise(bounds)]
        whole = bytes(element_bytes(pool, tensor)[0:numel])
    assert whole == b"".join(parts)
    got = np.frombuffer(whole, np.uint8)
    want = expected.view(torch.uint8).numpy().reshape(-1)
    bad = np.flatnonzero(got != want) // (WIDTH * torch_dtype(dtype).itemsize)
    assert not len(bad), f"rows differ: {sorted(set(bad.tolist()))}"
