"""Data parallelism: `torchrun --nproc-per-node 2` on CPU (gloo) against one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.train_helpers import headers, in_layers, load_tensors, tiny_config, write_corpus
from train.api import train

ROOT = Path(__file__).resolve().parents[1]


def _distance(a: dict, b: dict) -> float:
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


def test_torchrun_two_ranks_equal_one_process_with_the_same_global_batch(families, tmp_path):
    base = families("gemma3mm")["base"]
    corpus = str(write_corpus(tmp_path / "sk.jsonl", docs=80))
    out = tmp_path / "ddp"
    options = [
        "--max-steps",
        "3",
        "--block-size",
        "16",
        "--lr",
        "1e-2",
        "--lr-scheduler",
        "constant",
        "--freeze",
        "1:3",
        "--l2sp",
        "*=5",
        "-q",
    ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "cli.py"),
        "train",
        str(base),
        str(out),
        "--data",
        corpus,
        "--batch-size",
        "1",
        *options,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"saved {out}" in result.stdout

    assert headers(out) == headers(base)
    before, ddp = load_tensors(base), load_tensors(out)
    frozen = [n for n in before if in_layers(n, {1, 2}) or n.startswith("vision_tower.")]
    assert all(torch_equal(before[n], ddp[n]) for n in frozen)

    # One process with batch 2 sees the same 2 blocks per step. The L2-SP gradient must not be
    # counted once per rank: doubling lambda moves the weights far more than the two runs differ.
    common = dict(max_steps=3, block_size=16, freeze="1:3")
    single = load_tensors(
        train(tiny_config(base, tmp_path / "one", [corpus], l2sp="*=5", **common))
    )
    doubled = load_tensors(
        train(tiny_config(base, tmp_path / "two", [corpus], l2sp="*=10", **common))
    )
    assert _distance(ddp, single) < 0.1 * _distance(single, doubled)


def torch_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and torch.equal(a, b)
