"""Data parallelism: `torchrun --nproc-per-node 2` on CPU (gloo) against one process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.train_helpers import (
    headers,
    in_layers,
    load_tensors,
    tiny_config,
    torchrun_train,
    write_corpus,
)
from train.api import train

ROOT = Path(__file__).resolve().parents[1]

# Three steps at a constant learning rate: every run here compares results, not convergence.
SHORT_RUN = ["--max-steps", "3", "--block-size", "16", "--lr", "1e-2", "--lr-scheduler", "constant"]


def _distance(a: dict, b: dict) -> float:
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


def test_torchrun_two_ranks_equal_one_process_with_the_same_global_batch(families, tmp_path):
    base = families("gemma3mm")["base"]
    corpus = str(write_corpus(tmp_path / "sk.jsonl", docs=80))
    out = tmp_path / "ddp"
    options = [
        *SHORT_RUN,
        "--freeze",
        "1:3",
        "--l2sp",
        "*=5",
        "-q",
    ]
    result = _torchrun(base, out, corpus, ["--batch-size", "1", *options], tmp_path)
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


def _torchrun(base, out, corpus, options, tmp_path):
    return torchrun_train(2, base, out, corpus, options)


def _logged(folder) -> list[dict]:
    """The training log lines of a run (loss, L2-SP penalty, drift per group, eval/ scores)."""
    history = json.loads((folder / "surgery_train.json").read_text())["log_history"]
    return [
        {k: v for k, v in line.items() if k == "loss" or "/" in k or "l2sp" in k}
        for line in history
        if "loss" in line
    ]


def test_fsdp_two_ranks_with_l2sp_ema_freeze_equal_one_process(families, tmp_path):
    """FSDP2 on 2 gloo ranks: the L2-SP reference and the EMA anchor are shards of each rank's
    parameter shards, and the run matches one process with the same global batch; held-out
    scores (--eval-every, every rank scoring its shards together) match too."""
    from eval.api import evaluate, load_tasks

    base = families("llama")["base"]
    corpus = str(write_corpus(tmp_path / "sk.jsonl", docs=80))
    held = write_corpus(tmp_path / "held.txt", docs=6, seed=5)
    strategies = dict(l2sp="1:3=0.05,*=0.001", ema=0.92, freeze="1:2")
    common = [
        "--max-steps",
        "4",
        "--block-size",
        "16",
        "--lr",
        "1e-2",
        "--lr-scheduler",
        "constant",
        "--logging-steps",
        "1",
        "-q",
    ]
    flags = [f"--{k}={v}" for k, v in strategies.items()]
    out = tmp_path / "fsdp"
    scoring = ["--eval-every", "2", "-t", f"ppl:{held}"]
    result = _torchrun(
        base,
        out,
        corpus,
        [*common, *flags, *scoring, "--batch-size", "1", "--fsdp", "full_shard auto_wrap"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "surgery_train.json").read_text())
    assert record["sharded"] and record["world_size"] == 2 and record["global_batch_blocks"] == 2

    tasks = load_tasks([f"ppl:{held}"])

    def score(model, tokenizer):
        metrics = evaluate(model, tokenizer, tasks, progress=False)["metrics"]
        return {k: v for k, v in metrics.items() if isinstance(v, float)}  # as the command

    single_out = train(
        tiny_config(
            base,
            tmp_path / "one",
            [corpus],
            max_steps=4,
            batch_size=2,
            logging_steps=1,
            eval_every=2,
            eval_tasks=[f"ppl:{held}"],
            **strategies,
        ),
        score=score,
    )
    single = json.loads((single_out / "surgery_train.json").read_text())
    # Each rank holds half of the L2-SP reference and of the EMA anchor (plus FSDP's padding).
    for kind in ("l2sp_reference", "ema_anchor"):
        held, whole = record["held_bytes_rank0"][kind], single["held_bytes_rank0"][kind]
        assert 0.45 * whole < held < 0.6 * whole, (kind, held, whole)

    # The same losses, penalties and drifts at every step (float32 sums in another order).
    sharded_logs, single_logs = _logged(out), _logged(single_out)
    assert len(sharded_logs) == len(single_logs) == 4
    assert [bool(a.get("eval/ppl/held/ppl")) for a in sharded_logs] == [False, True] * 2
    for a, b in zip(sharded_logs, single_logs, strict=True):
        assert a.keys() == b.keys() and "l2sp_penalty" in a and "drift/layers_1" in a
        for key in a:
            assert abs(float(a[key]) - float(b[key])) <= 1e-4 * max(abs(float(b[key])), 1e-3), key

    before, sharded, one = load_tensors(base), load_tensors(out), load_tensors(single_out)
    assert headers(out) == headers(base)
    frozen = [n for n in before if in_layers(n, {1})]
    assert frozen and all(torch_equal(before[n], sharded[n]) for n in frozen)
    moved = _distance(one, before)
    assert moved > 0 and _distance(sharded, one) <= 0.05 * moved


def test_fsdp_two_ranks_lora_with_freeze_equal_one_process(families, tmp_path):
    """LoRA under FSDP2: adapters trained on shards, merged from the gathered weights."""
    base = families("llama")["base"]
    corpus = str(write_corpus(tmp_path / "sk.jsonl", docs=80))
    common = [
        *SHORT_RUN,
        "--freeze",
        "1:2",
        "--lora",
        "r=4,alpha=8",
        "-q",
    ]
    out = tmp_path / "fsdp"
    options = [*common, "--batch-size", "1", "--fsdp", "full_shard auto_wrap"]
    result = _torchrun(base, out, corpus, options, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    single_out = train(
        tiny_config(
            base,
            tmp_path / "one",
            [corpus],
            max_steps=3,
            batch_size=2,
            freeze="1:2",
            lora="r=4,alpha=8",
        )
    )
    before, sharded, one = load_tensors(base), load_tensors(out), load_tensors(single_out)
    assert headers(out) == headers(base)
    assert all(torch_equal(before[n], sharded[n]) for n in before if in_layers(n, {1}))
    moved = _distance(one, before)
    assert moved > 0 and _distance(sharded, one) <= 0.01 * moved
