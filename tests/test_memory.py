"""Memory does not grow with tensor size: blends stream in bounded chunks."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from bench.measure import measure
from surgery.engine.shard_hash import PENDING_LIMIT


def _checkpoint(path: Path, numel: int, seed: int, row: int | None = None) -> Path:
    path.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    shape = (numel // row, row) if row else (numel,)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(shape, generator=gen).to(torch.bfloat16),
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


def _merge_peak(
    tmp_path: Path,
    numel: int,
    method: str,
    params: str = "{weight: 0.5, density: 0.3}",
    shared: str = "",
    count: int = 3,
) -> int:
    models = [_checkpoint(tmp_path / f"m{method}{numel}-{i}", numel, i, 4096) for i in range(count)]
    config = f"merge_method: {method}\nbase_model: {models[0]}\n{shared}models:\n" + "".join(
        f"  - model: {m}\n    parameters: {params}\n" for m in models[1:]
    )
    path = tmp_path / f"{method}{numel}.yml"
    path.write_text(config)
    code = "import sys; from surgery.api import merge; merge(sys.argv[1], sys.argv[2], quiet=True)"
    out = tmp_path / f"out-{method}{numel}"
    result = measure([sys.executable, "-c", code, str(path), str(out)])
    assert result.returncode == 0
    return result.peak_anon


@pytest.mark.slow  # about 100 s on 2 busy cores: six processes, four 32 MB checkpoints
def test_merge_memory_does_not_grow_with_tensor_size(tmp_path):
    # TIES finds its magnitude thresholds in a chunked pass (a sampled window) and DELLA ranks
    # row by row: a 32 MB tensor (64 MB as float32, which mergekit would hold three of and
    # sort) costs the same private memory as a 2 MB one.
    for method in ("ties", "della"):
        small = _merge_peak(tmp_path, 2**20, method)
        large = _merge_peak(tmp_path, 16 * 2**20, method)
        print(f"{method} peak RssAnon: {small / 2**20:.0f} MiB, {large / 2**20:.0f} MiB")
        assert large - small < 32 * 2**20, (method, small, large)


# mergekit's other methods with whole-tensor reductions (a variance selection, Gram matrices,
# counts, sampled quantiles): (method, per-model parameters, shared parameters, models).
REDUCING = [
    ("sce", "{}", "parameters: {select_topk: 0.3}\n", 3),
    ("karcher", "{}", "", 3),
    ("multislerp", "{weight: 0.5}", "", 3),
    ("ramplus_tl", "{}", "parameters: {epsilon: 0.01}\n", 3),
    ("arcee_fusion", "{}", "", 2),
]


@pytest.mark.slow  # about 20 s a method on 2 busy cores
@pytest.mark.parametrize(("method", "params", "shared", "count"), REDUCING)
def test_reducing_merge_methods_run_in_flat_memory(tmp_path, method, params, shared, count):
    # Every reduction is a chunked pass (arcee_fusion's sample is 10^6 elements whatever the
    # tensor's size), so a 32 MB tensor (64 MB as float32, which mergekit holds three of) costs
    # what a 2 MB one does, but for the writer's fixed buffers: the 32 MB tensor's map runs as
    # segments on two workers, and a segment done before the one ahead of it is hashed waits as
    # a copy (at most PENDING_LIMIT). Measured: +0 to +20 MiB, the same at 64 MB as at 32.
    small = _merge_peak(tmp_path, 2**20, method, params, shared, count)
    large = _merge_peak(tmp_path, 16 * 2**20, method, params, shared, count)
    print(f"{method} peak RssAnon: {small / 2**20:.0f} MiB, {large / 2**20:.0f} MiB")
    assert large - small < PENDING_LIMIT, (method, small, large)
