"""Memory does not grow with tensor size: blends stream in bounded chunks."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.measure import measure


def _checkpoint(path: Path, numel: int, seed: int) -> Path:
    path.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(numel, generator=gen).to(torch.bfloat16),
        "model.norm.weight": torch.ones(16, dtype=torch.bfloat16),
    }
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def _soup_peak(tmp_path: Path, numel: int) -> int:
    experts = [_checkpoint(tmp_path / f"e{numel}-{i}", numel, i) for i in range(3)]
    code = (
        "import sys; from surgery.api import soup; soup(sys.argv[1:-1], sys.argv[-1], quiet=True)"
    )
    result = measure([sys.executable, "-c", code, *map(str, experts), str(tmp_path / f"o{numel}")])
    assert result.returncode == 0
    return result.peak_anon


def test_soup_memory_does_not_grow_with_tensor_size(tmp_path):
    small = _soup_peak(tmp_path, 2**20)  # 2 MB tensors
    large = _soup_peak(tmp_path, 48 * 2**20)  # 96 MB tensors: loading three would cost 288 MB
    # Chunk buffers are fixed (16 MiB float32 accumulator, 8 MiB read, 8 MiB output): the
    # difference between a 2 MB and a 96 MB tensor must stay well below one input tensor.
    print(f"peak RssAnon: {small / 2**20:.0f} MiB (2 MB tensors), {large / 2**20:.0f} MiB (96 MB)")
    assert large - small < 64 * 2**20, (small, large)
