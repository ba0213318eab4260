"""End-to-end training runs on tiny models: freezing, layouts, L2-SP, EMA, LoRA, resume."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, TrainerCallback

from cli import cli
from surgery.core.errors import CheckpointError, OutputError
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
from train.errors import TrainConfigError
from train.strategies.curriculum import CurriculumOptions
from train.strategies.l2sp import L2SPOptions


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
    config = TrainConfig(
        base="b",
        output="o",
        data=[],
        curriculum=CurriculumOptions(limits=["0.5"]),
        l2sp=L2SPOptions(lambdas="1:3=0.1"),
    )
    assert strategies(config) == ("strategies: --l2sp 1:3=0.1, --l2sp-form sum, --mix-until 0.5")
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


def _listing(folder) -> dict[str, bytes]:
    """Every file under a folder, by relative path, with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_cli_force_replaces_an_existing_out_and_only_with_force(families, tmp_path, corpus):
    base = families("llama")["base"]
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-9").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-9" / "stale.bin").write_bytes(b"old run")
    (out / "model.safetensors").write_bytes(b"not the new weights")
    (out / "notes.txt").write_text("left by an earlier run\n")
    before = _listing(out)
    args = ["train", str(base), str(out), "--data", corpus, "--max-steps", "2", "--block-size"]
    args += ["16", "--batch-size", "2", "-q"]
    runner = CliRunner()

    refused = runner.invoke(cli, args)
    assert refused.exit_code == 2 and refused.output.count("\n") == 1, refused.output
    assert "already exists" in refused.output and "--force" in refused.output
    assert _listing(out) == before  # nothing touched

    inside = runner.invoke(cli, [*args[:2], str(base / "sub"), *args[3:], "--force"])
    assert inside.exit_code == 2 and "lies inside the input" in inside.output
    assert not (base / "sub").exists()

    forced = runner.invoke(
        cli,
        [*args, "--force", "--keep-checkpoints", "--save-steps", "1", "--save-total-limit", "5"],
    )
    assert forced.exit_code == 0, forced.output
    assert f"saved {out}" in forced.stdout
    # Replaced: the new checkpoint and this run's checkpoints (kept), nothing of the earlier run.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "checkpoint-1",
        "checkpoint-2",
    ]
    assert not (out / "notes.txt").exists() and not (out / "model.safetensors").exists()
    assert headers(out) == headers(base)
    assert_valid_output(out)
    record = json.loads((out / "surgery_train.json").read_text())
    assert record["config"]["force"] is True and record["steps"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]  # no staging left


def test_force_with_resume_continues_and_replaces_the_rest(families, tmp_path, corpus):
    """An interrupted --force run over a finished OUT leaves OUT with its checkpoints/: --resume
    alone refuses it (a finished run), --resume --force continues it exactly."""
    base = families("llama")["base"]
    options = dict(max_steps=5, save_steps=3)
    straight = train(tiny_config(base, tmp_path / "straight", [corpus], **options))
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier run\n")
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(base, out, [corpus], force=True, **options), callbacks=[Interrupt()])
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "notes.txt"]
    with pytest.raises(OutputError, match="not resumed"):
        tiny_config(base, out, [corpus], resume=True, **options).validate()
    steps = Steps()
    resumed = train(
        tiny_config(base, out, [corpus], resume=True, force=True, **options), callbacks=[steps]
    )
    assert steps.seen == [4, 5]
    expected, got = load_tensors(straight), load_tensors(resumed)
    assert all(_same(expected[n], got[n]) for n in expected)
    assert not (out / "notes.txt").exists() and not (out / "checkpoints").exists()


def _eval_entries(history: list[dict]) -> dict[int, dict[str, float]]:
    """step -> the eval/ values logged at that step."""
    found: dict[int, dict[str, float]] = {}
    for entry in history:
        scores = {k: v for k, v in entry.items() if k.startswith("eval/")}
        if scores:
            found.setdefault(entry["step"], {}).update(scores)
    return found


def test_cli_eval_every_logs_scores_equal_to_surgery_eval(families, tmp_path, corpus):
    """`--eval-every 2 -t ppl:FILE` on 4 steps: eval/ metrics in the loss's log line at steps 2
    and 4, equal metric for metric to `surgery eval` on the Trainer's checkpoints of those steps
    (saved in float32; OUT itself is rounded to BASE's bf16)."""
    base = families("llama")["base"]
    held = write_corpus(tmp_path / "held.txt", docs=10, seed=5)
    out = tmp_path / "out"
    args = ["train", str(base), str(out), "--data", corpus, "--max-steps", "4"]
    args += ["--block-size", "16", "--batch-size", "2", "--lr", "1e-2", "--logging-steps", "1"]
    args += ["--save-steps", "2", "--keep-checkpoints", "--eval-every", "2", "-t", f"ppl:{held}"]
    runner = CliRunner()
    result = runner.invoke(cli, [*args, "-q"])
    assert result.exit_code == 0, result.output
    assert "'eval/ppl/held/ppl'" in result.stdout  # in the console's log lines
    record = json.loads((out / "surgery_train.json").read_text())
    assert record["config"]["eval_every"] == 2
    assert record["config"]["eval_tasks"] == [f"ppl:{held}"]
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert recipe["config"]["eval_every"] == 2 and "eval_tasks" in recipe["config"]
    assert "eval_every: 2" in (out / "README.md").read_text()
    history = record["log_history"]
    logged = _eval_entries(history)
    assert sorted(logged) == [2, 4]
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4]
    for step, scores in logged.items():
        assert "loss" in next(e for e in history if e["step"] == step and "eval/ppl/held/ppl" in e)
        report = tmp_path / f"eval-{step}.json"
        folder = out / "checkpoints" / f"checkpoint-{step}"
        done = runner.invoke(cli, ["eval", str(folder), "-t", f"ppl:{held}", "-o", str(report)])
        assert done.exit_code == 0, done.output
        expected = json.loads(report.read_text())["metrics"]
        wanted = {f"eval/{k}": v for k, v in expected.items() if isinstance(v, float)}
        assert scores.keys() == wanted.keys() and len(wanted) == 8  # 4 rates, their stderr
        for key, value in wanted.items():
            assert scores[key] == pytest.approx(value, rel=1e-9), key
    assert logged[4]["eval/ppl/held/ppl"] < logged[2]["eval/ppl/held/ppl"]  # it learned


class ModeAndScores(TrainerCallback):
    """After the held-out scoring of a step: the model's mode, and the eval runner's own scores
    of the model in memory at that step."""

    def __init__(self, tasks, tokenizer) -> None:
        self.tasks, self.tokenizer = tasks, tokenizer
        self.training: list[bool] = []
        self.scores: dict[int, dict] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        from eval.api import evaluate

        self.training.append(model.training)
        if state.global_step % 2 == 0:
            metrics = evaluate(model, self.tokenizer, self.tasks, progress=False)["metrics"]
            self.scores[state.global_step] = metrics


def test_eval_every_scores_in_eval_mode_and_leaves_training_unchanged(families, tmp_path, corpus):
    """The Python API: `train(config, score=...)` scores in eval mode without gradients on the
    training device, restores train mode, logs its own line when no loss is logged at the step,
    and the trained weights are bit-identical to a run without scoring."""
    from transformers import AutoTokenizer

    from eval.api import evaluate, load_tasks

    base = families("llama")["base"]
    held = write_corpus(tmp_path / "held.txt", docs=10, seed=5)
    tasks = load_tasks([f"ppl:{held}"])
    seen = []

    def score(model, tokenizer):
        seen.append((model.training, torch.is_grad_enabled(), next(model.parameters()).device))
        metrics = evaluate(model, tokenizer, tasks, progress=False)["metrics"]
        return {k: v for k, v in metrics.items() if isinstance(v, float)}

    options = dict(logging_steps=3, eval_every=2, eval_tasks=[f"ppl:{held}"])
    with pytest.raises(TrainConfigError, match="go together"):
        train(tiny_config(base, tmp_path / "none", [corpus], **options))
    assert not (tmp_path / "none").exists()
    check = ModeAndScores(tasks, AutoTokenizer.from_pretrained(base))
    scored = train(tiny_config(base, tmp_path / "scored", [corpus], **options), [check], score)
    assert seen == [(False, False, torch.device("cpu"))] * 2
    assert check.training == [True] * 4
    history = json.loads((scored / "surgery_train.json").read_text())["log_history"]
    logged = _eval_entries(history)
    assert sorted(logged) == sorted(check.scores) == [2, 4]
    for step, scores in logged.items():
        entry = next(e for e in history if e["step"] == step and "eval/ppl/held/ppl" in e)
        assert "loss" not in entry  # a line of its own: the loss is logged at steps 1 and 3
        expected = {f"eval/{k}": v for k, v in check.scores[step].items() if isinstance(v, float)}
        assert scores == expected
    assert [e["step"] for e in history if "loss" in e][:2] == [1, 3]
    plain = train(tiny_config(base, tmp_path / "plain", [corpus], logging_steps=3))
    expected, got = load_tensors(plain), load_tensors(scored)
    assert all(_same(expected[n], got[n]) for n in expected)


def test_quiet_training_shows_no_loading_bar_and_says_a_rerun_once(families, tmp_path, caplog):
    """`train -q`: no transformers loading bar; a small corpus read many times over is said
    once, with the count, not at every pass."""
    corpus = write_corpus(tmp_path / "small.jsonl", docs=1, words=4)
    out = tmp_path / "out"
    args = ["train", str(families("llama")["base"]), str(out), "--data", f"small={corpus}"]
    args += ["--max-steps", "10", "--block-size", "8", "--batch-size", "2", "--seed", "0", "-q"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "Loading" not in result.stderr and "it/s" not in result.stderr, result.stderr
    # The log lines as records: the "train" logger's handler keeps the stderr of the first run.
    reruns = [r.getMessage() for r in caplog.records if "ran out" in r.getMessage()]
    assert len(reruns) == 1, reruns
    count = int(reruns[0].split("ran out ")[1].split(" ")[0])
    assert count > 2 and f"({count + 1} passes)" in reruns[0]
