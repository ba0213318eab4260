"""End-to-end training runs on tiny models: freezing, layouts, L2-SP, EMA, LoRA, resume."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, TrainerCallback

from cli import cli
from surgery.core.errors import CheckpointError
from tests.support.checks import assert_valid_output
from tests.support.train_helpers import (
    headers,
    in_layers,
    load_tensors,
    relative_drift,
    tiny_config,
    write_corpus,
)
from train.api import strategies, train
from train.config import TrainConfig


@pytest.fixture
def corpus(tmp_path):
    return str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))


def _scope(name: str) -> bool:
    """Tensors training may change (a multimodal checkpoint's vision side must not)."""
    return not name.startswith(("vision_tower.", "multi_modal_projector."))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


class Capture(TrainerCallback):
    """Records the trainable weights after each optimizer step (theta'), after each full step
    (theta, once the EMA has run) and at the end."""

    def __init__(self) -> None:
        self.after_optimizer: list[dict] = []
        self.after_step: list[dict] = []
        self.final: dict = {}

    @staticmethod
    def _snapshot(model) -> dict:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.after_optimizer.append(self._snapshot(model))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after_step.append(self._snapshot(model))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.final = self._snapshot(model)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma3mm", "gpt2"])
def test_freeze_keeps_layers_bit_identical_and_layout(families, tmp_path, corpus, arch):
    base = families(arch)["base"]
    out = train(tiny_config(base, tmp_path / "out", [corpus], freeze="1:3"))
    assert headers(out) == headers(base)  # names, dtypes, shapes and shard files
    assert_valid_output(out)  # verifies, index matches shards, recipe in every shard
    assert json.loads((out / "surgery_recipe.json").read_text())["operation"] == "train"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]  # no staging left
    before, after = load_tensors(base), load_tensors(out)
    frozen = [n for n in before if in_layers(n, {1, 2})]
    assert frozen and all(_same(before[n], after[n]) for n in frozen)
    rest = [n for n in before if n not in frozen and _scope(n)]
    unchanged = [n for n in rest if _same(before[n], after[n])]
    assert not unchanged, unchanged
    untouched = [n for n in before if not _scope(n)]
    assert all(_same(before[n], after[n]) for n in untouched)
    assert (arch == "gemma3mm") == bool(untouched)
    for name in ("config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes()

    # The surgery engine takes the output as TRAINED: revert layer 0 to BASE.
    reverted = tmp_path / "reverted"
    result = CliRunner().invoke(
        cli, ["revert", "--layers", "0", "-q", str(base), str(out), str(reverted)]
    )
    assert result.exit_code == 0, result.output
    merged = load_tensors(reverted)
    for name, tensor in merged.items():
        source = before if in_layers(name, {0}) else after
        assert _same(tensor, source[name]), name


def test_freeze_embeddings_with_bf16_weights(families, tmp_path, corpus):
    base = families("gemma3")["base"]  # tied embeddings: the head is the embedding matrix
    config = tiny_config(base, tmp_path / "out", [corpus], freeze_embeddings=True, dtype="bf16")
    out = train(config)
    before, after = load_tensors(base), load_tensors(out)
    assert _same(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    changed = [n for n in before if not _same(before[n], after[n])]
    assert len(changed) == len(before) - 1


def test_multimodal_checkpoint_loads_back_into_its_class(families, tmp_path, corpus):
    from transformers import Gemma3ForConditionalGeneration

    out = train(tiny_config(families("gemma3mm")["base"], tmp_path / "out", [corpus]))
    model, info = Gemma3ForConditionalGeneration.from_pretrained(
        out, dtype=torch.bfloat16, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    saved = load_tensors(out)
    layer = model.model.language_model.layers[2].mlp.down_proj.weight
    assert torch.equal(layer, saved["language_model.model.layers.2.mlp.down_proj.weight"])


def test_unmapped_multimodal_keys_are_refused(families, tmp_path, corpus, monkeypatch):
    # Without the key mapping, the text-only class would start from random weights.
    monkeypatch.setattr("train.checkpoint_io.text_only_key_mapping", lambda layout: {})
    with pytest.raises(CheckpointError, match="randomly initialized"):
        train(tiny_config(families("gemma3mm")["base"], tmp_path / "out", [corpus]))


def _final_weights(families, tmp_path, corpus, name, **overrides):
    capture = Capture()
    config = tiny_config(families("llama")["base"], tmp_path / name, [corpus], **overrides)
    train(config, callbacks=[capture])
    return capture.final


def test_l2sp_reduces_middle_layer_drift(families, tmp_path, corpus):
    base = load_tensors(families("llama")["base"])
    plain = load_tensors(
        train(tiny_config(families("llama")["base"], tmp_path / "plain", [corpus], max_steps=6))
    )
    held = load_tensors(
        train(
            tiny_config(
                families("llama")["base"],
                tmp_path / "l2sp",
                [corpus],
                max_steps=6,
                l2sp="1:3=20,*=0",
            )
        )
    )
    assert headers(tmp_path / "l2sp") == headers(families("llama")["base"])
    middle = [n for n in base if in_layers(n, {1, 2})]
    assert relative_drift(held, base, middle) < 0.7 * relative_drift(plain, base, middle)
    record = json.loads((tmp_path / "l2sp" / "surgery_train.json").read_text())
    penalties = [e["l2sp_penalty"] for e in record["log_history"] if "l2sp_penalty" in e]
    assert penalties and penalties[-1] > 0


def test_l2sp_is_counted_once_per_optimizer_step(families, tmp_path, corpus):
    # The same 2 blocks per step as one batch or two accumulated micro-batches: same update.
    # Counting the penalty per micro-batch would double it, like the lambda x 2 run.
    spec = "1:3=5,*=0.5"
    one = _final_weights(families, tmp_path, corpus, "one", l2sp=spec)
    accumulated = _final_weights(
        families, tmp_path, corpus, "acc", l2sp=spec, batch_size=1, grad_accum=2
    )
    doubled = _final_weights(families, tmp_path, corpus, "dbl", l2sp="1:3=10,*=1")

    def distance(a, b):
        return max(float((a[n] - b[n]).abs().max()) for n in a)

    assert distance(one, accumulated) < 0.05 * distance(one, doubled)


def test_ema_matches_a_recomputation_of_the_recorded_steps(families, tmp_path, corpus):
    alpha, every, steps = 0.8, 2, 5
    capture = Capture()
    config = tiny_config(
        families("llama")["base"],
        tmp_path / "out",
        [corpus],
        freeze="1:3",
        ema=alpha,
        ema_every=every,
        max_steps=steps,
    )
    out = train(config, callbacks=[capture])
    base = load_tensors(families("llama")["base"])
    anchor = {n: base[n].float() for n in capture.final}
    for step in range(1, steps + 1):
        optimized, recorded = capture.after_optimizer[step - 1], capture.after_step[step - 1]
        if step % every == 0:
            anchor = {n: alpha * anchor[n] + (1 - alpha) * optimized[n] for n in anchor}
            expected = anchor
        else:
            expected = optimized
        for name in anchor:
            torch.testing.assert_close(recorded[name], expected[name], rtol=0, atol=1e-6)
    # The run ends between two averages: one last average, which is what is saved.
    last = {n: alpha * anchor[n] + (1 - alpha) * capture.after_optimizer[-1][n] for n in anchor}
    assert headers(out) == headers(families("llama")["base"])
    saved = load_tensors(out)
    for name in anchor:
        torch.testing.assert_close(capture.final[name], last[name], rtol=0, atol=1e-6)
        assert torch.equal(saved[name], capture.final[name].to(torch.bfloat16))
    assert all(_same(saved[n], base[n]) for n in base if in_layers(n, {1, 2}))


def test_lora_saves_merged_full_weights(families, tmp_path, corpus):
    base_dir = families("llama")["base"]
    out = train(tiny_config(base_dir, tmp_path / "out", [corpus], lora="r=4,alpha=8", freeze="1:3"))
    assert headers(out) == headers(base_dir)
    model, info = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.bfloat16, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not any("lora" in name for name in load_tensors(out))
    before, after = load_tensors(base_dir), load_tensors(out)
    loaded = model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(loaded, after["model.layers.0.self_attn.q_proj.weight"])
    adapted = [n for n in before if in_layers(n, {0, 3}) and n.endswith("proj.weight")]
    assert adapted and not any(_same(before[n], after[n]) for n in adapted)
    others = [n for n in before if n not in adapted]
    assert all(_same(before[n], after[n]) for n in others)  # frozen layers, norms, embeddings


class Interrupt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 4:
            raise KeyboardInterrupt


class Steps(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(state.global_step)


def test_resume_continues_exactly(families, tmp_path, corpus):
    base = families("llama")["base"]
    # The checkpoint at step 3 falls between two averages: its EMA anchor (theta_2) must be
    # restored from the checkpoint, not taken from BASE or from the weights at step 3.
    options = dict(max_steps=5, save_steps=3, l2sp="*=0.5", ema=0.8, ema_every=2)
    straight = train(tiny_config(base, tmp_path / "straight", [corpus], **options))
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(base, tmp_path / "resumed", [corpus], **options), callbacks=[Interrupt()])
    assert sorted(p.name for p in (tmp_path / "resumed").iterdir()) == ["checkpoints"]
    assert (
        tmp_path / "resumed" / "checkpoints" / "checkpoint-3" / "ema_anchor.safetensors"
    ).is_file()
    steps = Steps()
    resumed = train(
        tiny_config(base, tmp_path / "resumed", [corpus], resume=True, **options), callbacks=[steps]
    )
    assert steps.seen == [4, 5]  # continued from checkpoint-3, not from scratch
    expected, got = load_tensors(straight), load_tensors(resumed)
    assert all(_same(expected[n], got[n]) for n in expected)
    assert not (resumed / "checkpoints").exists()


def test_cli_mix_curriculum_and_token_budget(families, tmp_path):
    sk = write_corpus(tmp_path / "sk.jsonl.gz", docs=80, seed=1)
    en = write_corpus(tmp_path / "en.txt", docs=40, seed=2)
    out = tmp_path / "out"
    # 3 steps of 2 x 16 tokens are 96 tokens: 70 tokens round up to 3 steps.
    args = [
        "train",
        str(families("gemma3")["base"]),
        str(out),
        "--data",
        f"sk={sk}:0.8",
        "--data",
        f"en={en}:0.2",
        "--mix-until",
        "0.5",
        "--max-tokens",
        "70",
        "--block-size",
        "16",
        "--batch-size",
        "2",
        "--lr",
        "1e-3",
        "--logging-steps",
        "1",
        "--report-to",
        "none",
        "-q",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("saved ") == 1 and f"saved {out}" in result.stdout
    config = TrainConfig(base="b", output="o", data=[], mix_until=["0.5"], l2sp="1:3=0.1")
    assert strategies(config) == ("strategies: --l2sp 1:3=0.1, --mix-until 0.5")
    record = json.loads((out / "surgery_train.json").read_text())
    assert record["steps"] == 3 and record["tokens"] == 96
    logs = [e for e in record["log_history"] if "loss" in e]
    assert len(logs) == 3
    for key in (
        "loss",
        "learning_rate",
        "tokens_per_second",
        "drift/outside",
        "drift/layers_0",
        "drift/layers_1",
        "drift/layers_2:4",
    ):
        assert all(key in entry for entry in logs), key
    assert not (out / "checkpoints").exists()


def test_keep_checkpoints_carries_them_into_the_saved_output(families, tmp_path, corpus):
    config = tiny_config(
        families("llama")["base"], tmp_path / "out", [corpus], save_steps=2, keep_checkpoints=True
    )
    out = train(config)
    assert (out / "checkpoints" / "checkpoint-2").is_dir()
    assert headers(out) == headers(families("llama")["base"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]
