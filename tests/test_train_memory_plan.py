"""`surgery train --dry-run`: the memory plan from a config.json alone, checked against the
parameters a real run trains and against a measured peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from train.config import TrainConfig
from train.memory_plan import count_parameters, meta_model, plan_memory, read_config
from train.strategies.l2sp import L2SPOptions

ROOT = Path(__file__).resolve().parents[1]


def gemma3_4b_config(folder: Path) -> Path:
    """A Gemma-3-4B-sized multimodal config.json (public sizes), and nothing else."""
    from transformers import Gemma3Config

    config = Gemma3Config(
        text_config=dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            vocab_size=262208,
            sliding_window=1024,
            max_position_embeddings=131072,
        ),
        vision_config=dict(
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=27,
            num_attention_heads=16,
            image_size=896,
            patch_size=14,
            vision_use_head=False,
        ),
        mm_tokens_per_image=256,
        dtype="bfloat16",
    )
    config.save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    return folder


def test_dry_run_gemma3_4b_l2sp_fits_fsdp_not_ddp(tmp_path):
    base = gemma3_4b_config(tmp_path / "gemma-3-4b")
    out = tmp_path / "out"
    options = ["--l2sp", "9:28=0.05,*=0.001", "--batch-size", "4", "--block-size", "1024"]
    result = CliRunner().invoke(
        cli,
        [
            "train",
            str(base),
            str(out),
            "--dry-run",
            "--gpus",
            "8",
            "--gpu-memory",
            "80GB",
            *options,
        ],
    )
    assert result.exit_code == 0, result.output
    assert not out.exists()
    lines = {line[:40].strip(): line[40:].split() for line in result.output.splitlines()}
    assert "3.88 B (3.88 B trained, 0 frozen)" in result.output
    # 3.88 B float32 parameters: 15.5 GB each for weights, gradients and the L2-SP reference.
    assert lines["weights"] == ["15.5", "GB", "1.94", "GB"]
    assert lines["L2-SP reference"] == ["15.5", "GB", "1.94", "GB"]
    assert lines["optimizer (AdamW moments)"] == ["31", "GB", "3.88", "GB"]
    assert lines["fits 8 x 80 GB"] == ["no", "yes"]
    assert lines["fits 8 x 80 GB, checkpointing"] == ["no", "yes"]

    plan = plan_memory(
        TrainConfig(
            base=str(base),
            output=out,
            data=(),
            l2sp=L2SPOptions(lambdas="9:28=0.05,*=0.001"),
            batch_size=4,
            block_size=1024,
        ),
        gpus=8,
        gpu_memory=80 * 10**9,
    )
    ddp, fsdp = plan.totals(checkpointed=True)
    assert ddp > 80e9 > 0.9 * 80e9 > fsdp  # the point: L2-SP needs FSDP at this size


def test_dry_run_rejects_a_bad_size_and_a_missing_config(tmp_path):
    runner = CliRunner()
    base = gemma3_4b_config(tmp_path / "g")
    bad = runner.invoke(
        cli, ["train", str(base), str(tmp_path / "o"), "--dry-run", "--gpu-memory", "80XB"]
    )
    assert bad.exit_code == 2 and "cannot parse size" in bad.output
    (tmp_path / "empty").mkdir()
    missing = runner.invoke(
        cli, ["train", str(tmp_path / "empty"), str(tmp_path / "o"), "--dry-run"]
    )
    assert missing.exit_code == 2 and "no config.json" in missing.output


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"freeze": "1:3"},
        {"freeze": "0:2", "freeze_embeddings": True},
        {"l2sp": "1:3=0.05"},
        {"lora": "r=4,alpha=8"},
        {"lora": "r=2,targets=q_proj", "freeze": "0"},
    ],
)
def test_plan_counts_what_a_real_run_trains(families, tmp_path, options):
    """The meta-device counts equal the real model's, as the training code prepares it."""
    from train.load import load
    from train.prepare import prepare

    base = families("llama")["base"]
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n")
    config = TrainConfig.from_options(
        base=str(base), output=tmp_path / "o", data=[str(corpus)], max_steps=1, **options
    )
    folder, raw = read_config(str(base))
    counts = count_parameters(meta_model(folder, raw), config)
    plan = config.validate()
    model, _, mapped = load(plan.layout, plan.dtype, plan.strategies.modules, progress=False)
    model = prepare(model, mapped, plan.strategies, plan.layout.text_stack)
    layers = mapped.layers
    params = dict(model.named_parameters())
    assert counts.total == sum(p.numel() for p in params.values())
    assert counts.trained == sum(p.numel() for p in params.values() if p.requires_grad)
    if "l2sp" in options:
        expected = sum(
            p.numel() for n, p in params.items() if p.requires_grad and layers[n] in (1, 2)
        )
        assert counts.regularized == expected


@pytest.mark.slow
def test_plan_is_within_25_percent_of_the_measured_peak():
    """One process on CPU, peak RssAnon over train() (bench/bench_train.py --memory)."""
    command = [
        sys.executable,
        str(ROOT / "bench" / "bench_train.py"),
        "--memory",
        "--modes",
        "single",
        "--hidden",
        "512",
        "--layers",
        "8",
        "--vocab",
        "8192",
        "--block",
        "128",
        "--batch",
        "2",
        "--steps",
        "3",
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    rows = json.loads(result.stdout.strip().splitlines()[-1])["rows"]
    assert len(rows) == 3
    for variant, _mode, _rank, measured, predicted in rows:
        assert 0.75 <= predicted / measured <= 1.25, (variant, measured, predicted)
