"""Checkpoints as people publish them: a multimodal base and its text-only fine-tunes (Gemma-3,
Mistral-3), the namings transformers has used for one class, a grown vocabulary.

BASE is a tiny multimodal model saved by transformers (`language_model.model.*` beside a vision
tower, as the Hub's files are) or renamed as some transformers 4.x releases saved it
(`model.language_model.*`);
TRAINED is its text model made text-only the reference code's way (`tiny_models.text_only`), then
trained (seeded noise). Expected outputs are built here by hand from the inputs' tensors, named
by this file's own rules, never by the engine's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner

from cli import cli
from surgery.core.errors import MismatchError
from surgery.diagnostics.drift import drift, format_drift
from surgery.diagnostics.memory_blend import MemoryBlender
from surgery.engine.ops.interpolate import plan_interpolate
from surgery.engine.reader import open_checkpoint
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, same_bits

GROWN = 40  # rows the grown Llama's vocabulary adds


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_refused(result, message: str, folder: Path) -> None:
    """Exit 2, one line on stderr naming the problem, nothing written at `folder / out`."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    assert not (folder / "out").exists()


def published_name(text_name: str) -> str:
    """A text-only tensor name as the multimodal checkpoint's files name it."""
    if text_name.startswith("lm_head."):
        return "language_model." + text_name
    return "language_model.model." + text_name.removeprefix("model.")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """`made(arch)` -> paths: base (multimodal, published naming), nested (the same, named as
    transformers 4.x saved it), trained and expert (text-only fine-tunes), mm_trained (the
    multimodal model trained whole)."""
    root = tmp_path_factory.mktemp("layouts")
    built: dict[str, dict[str, Path]] = {}

    def get(arch: str) -> dict[str, Path]:
        if arch in built:
            return built[arch]
        folder = root / arch
        model = tiny_models.build_model(arch)
        paths = {"base": tiny_models.save(model, folder / "base")}
        shutil.copytree(paths["base"], folder / "nested")
        tiny_models.rename_tensors(folder / "nested", tiny_models.nested_name)
        paths["nested"] = folder / "nested"
        paths["trained"] = tiny_models.save(
            tiny_models.perturb(tiny_models.text_only(model), seed=100), folder / "trained"
        )
        paths["expert"] = tiny_models.save(
            tiny_models.perturb(tiny_models.text_only(model), seed=101), folder / "expert"
        )
        paths["mm_trained"] = tiny_models.save(
            tiny_models.perturb(tiny_models.build_model(arch), seed=102), folder / "mm_trained"
        )
        built[arch] = paths
        return paths

    return get


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A Llama base and the same model trained with GROWN rows added to its vocabulary."""
    root = tmp_path_factory.mktemp("grown")
    base = tiny_models.save(tiny_models.build_model("llama"), root / "base")
    rows = tiny_models.vocab_size() + GROWN
    trained = tiny_models.save(tiny_models.grown_llama(rows, seed=100), root / "grown")
    return base, trained


def _text_class(path: Path):
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture)


def _logits(model) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 2]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def within_one_rounding(got: torch.Tensor, terms: list[torch.Tensor]) -> bool:
    """`got` (bf16) is the float64 sum of `terms` up to the engine's roundings: the float32
    weights and sum (2^-24 of the terms' magnitudes each) and one bf16 rounding (half an ulp,
    2^-8 of the value)."""
    exact = sum(t.double() for t in terms)
    magnitude = sum(t.double().abs() for t in terms)
    return bool(((got.double() - exact).abs() <= 2**-8 * exact.abs() + 2**-22 * magnitude).all())


def base_name(text_name: str, naming: str) -> str:
    """A text-only tensor name as BASE names it: `base` (published) or `nested`."""
    published = published_name(text_name)
    return published if naming == "base" else tiny_models.nested_name(published)


def in_layers(name: str, layers) -> bool:
    return any(name.startswith(f"model.layers.{i}.") for i in layers)


@pytest.mark.parametrize("arch", tiny_models.MULTIMODAL)
@pytest.mark.parametrize("naming", ["base", "nested"])
def test_revert_of_a_text_only_fine_tune_to_its_multimodal_base(made, tmp_path, arch, naming):
    paths = made(arch)
    result = run("revert", "--layers", "1:3", paths[naming], paths["trained"], tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "vision_tower.* (" in result.stderr and "have no counterpart" in result.stderr
    got = assert_valid_output(tmp_path / "out")
    trained, base = load_state(paths["trained"]), load_state(paths[naming])
    # By hand: layers 1 and 2 from BASE (under its names), every other tensor TRAINED's.
    expected = {
        name: base[base_name(name, naming)] if in_layers(name, (1, 2)) else tensor
        for name, tensor in trained.items()
    }
    assert got.keys() == expected.keys()  # TRAINED's layout: text-only names, no vision tower
    for name, tensor in got.items():
        assert same_bits(tensor, expected[name]), name
    # It loads as TRAINED's class and computes what those weights loaded by hand compute.
    text_class = _text_class(paths["trained"])
    loaded = text_class.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert type(loaded) is text_class
    by_hand = text_class(loaded.config)  # float32, as loaded: buffers alike
    state = {name: tensor.float() for name, tensor in expected.items()}
    missing, unexpected = by_hand.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    by_hand.tie_weights()
    assert torch.equal(_logits(loaded), _logits(by_hand))
    recipe = json.loads((tmp_path / "out" / "surgery_recipe.json").read_text())
    assert recipe["matching"]["layouts"]["trained"] == "text-only"
    assert "vision_tower.*" in recipe["matching"]["without_counterpart"]["base"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "different tensor names" in card and "had no counterpart" in card
    assert not (tmp_path / "out" / "mergekit_config.yml").exists()  # mergekit matches by name


@pytest.mark.parametrize("arch", tiny_models.MULTIMODAL)
def test_interpolate_endpoints_are_the_inputs_text_weights(made, tmp_path, arch):
    paths = made(arch)
    trained, base = load_state(paths["trained"]), load_state(paths["base"])
    for alpha, expected in (("0", base), ("1", trained)):
        out = tmp_path / f"a{alpha}"
        result = run("interpolate", "--alpha", alpha, paths["base"], paths["trained"], out)
        assert result.exit_code == 0, result.output
        got = assert_valid_output(out)
        assert got.keys() == trained.keys()
        for name, tensor in got.items():
            key = published_name(name) if alpha == "0" else name
            assert same_bits(tensor, expected[key]), (alpha, name)


def test_interpolate_between_layouts_is_the_float64_blend(made, tmp_path):
    paths = made("gemma3mm")
    out = tmp_path / "out"
    result = run("interpolate", "--alpha", "1:3=0.3,*=1", paths["nested"], paths["trained"], out)
    assert result.exit_code == 0, result.output
    trained, base = load_state(paths["trained"]), load_state(paths["nested"])
    for name, tensor in assert_valid_output(out).items():
        if not in_layers(name, (1, 2)):
            assert same_bits(tensor, trained[name]), name
            continue
        theirs = base[base_name(name, "nested")].double()
        assert within_one_rounding(tensor, [0.7 * theirs, 0.3 * trained[name].double()]), name


def test_a_multimodal_fine_tune_keeps_its_vision_tower_against_a_text_only_base(made, tmp_path):
    paths = made("gemma3mm")
    out = tmp_path / "out"
    result = run("revert", "--layers", "-1", paths["trained"], paths["mm_trained"], out)
    assert result.exit_code == 0, result.output
    got, mm = assert_valid_output(out), load_state(paths["mm_trained"])
    text = load_state(paths["trained"])
    assert got.keys() == mm.keys()
    for name, tensor in got.items():
        if name.startswith("language_model.model.layers.3."):
            expected = text["model." + name.removeprefix("language_model.model.")]
        else:
            expected = mm[name]
        assert same_bits(tensor, expected), name


def _gemma3_text(folder: Path, hidden: int, layers: int) -> Path:
    config = tiny_models.Gemma3TextConfig(
        vocab_size=tiny_models.vocab_size(),
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return tiny_models.save(tiny_models.Gemma3ForCausalLM(config), folder)


def test_other_text_models_are_still_refused(made, tmp_path):
    base = made("gemma3mm")["base"]
    wider = _gemma3_text(tmp_path / "wider", hidden=48, layers=tiny_models.NUM_LAYERS)
    result = run("revert", "--layers", "1:3", base, wider, tmp_path / "out")
    assert_refused(result, "has shape", tmp_path)
    deeper = _gemma3_text(tmp_path / "deeper", hidden=32, layers=6)
    result = run("interpolate", "--alpha", "0.5", base, deeper, tmp_path / "out")
    assert_refused(result, "different tensors: only in trained: model.layers.4.", tmp_path)
    llama = tiny_models.save(tiny_models.build_model("llama"), tmp_path / "llama")
    result = run("drift", base, llama)
    assert result.exit_code == 2 and "different architectures (llama, gemma3_text)" in result.stderr


def test_soup_and_merge_refuse_a_multimodal_and_a_text_only_expert(made, tmp_path):
    paths = made("gemma3mm")
    result = run("soup", paths["trained"], paths["mm_trained"], tmp_path / "out")
    assert_refused(result, "has 50 tensors that expert 1", tmp_path)
    assert "vision_tower.* (48), multi_modal_projector.* (2)" in result.stderr
    config = tmp_path / "merge.yml"
    models = [{"model": str(paths[n]), "parameters": {"weight": 1.0}} for n in ("base", "expert")]
    config.write_text(json.dumps({"merge_method": "linear", "models": models}))
    result = run("merge", config, tmp_path / "out")
    assert_refused(result, "every input must hold the same tensors", tmp_path)


def test_soup_across_namings_takes_the_first_layout(made, tmp_path):
    paths = made("gemma3mm")
    out = tmp_path / "out"
    result = run("soup", paths["base"], paths["nested"], paths["mm_trained"], out)
    assert result.exit_code == 0, result.output
    base, mm = load_state(paths["base"]), load_state(paths["mm_trained"])
    got = assert_valid_output(out)
    assert got.keys() == base.keys()
    for name, tensor in got.items():
        terms = [2 * base[name].double() / 3, mm[name].double() / 3]
        assert within_one_rounding(tensor, terms), name


def test_drift_across_layouts_is_the_direct_float64_computation(made):
    paths = made("mistral3")
    report = drift(open_checkpoint(paths["base"]), open_checkpoint(paths["trained"]))
    trained, base = load_state(paths["trained"]), load_state(paths["base"])
    assert report.tensors.keys() == trained.keys()
    diff = sum(
        float((trained[n].double() - base[published_name(n)].double()).norm() ** 2) for n in trained
    )
    norm = sum(float(base[published_name(n)].double().norm() ** 2) for n in trained)
    assert report.total.relative_l2 == pytest.approx((diff / norm) ** 0.5, rel=1e-12)


def test_the_in_memory_blend_is_the_written_interpolation(made, grown, tmp_path):
    """What sweep and localize score (a multimodal BASE beside a text-only TRAINED, Mistral-3's
    too, whose multimodal class no causal-LM auto class loads; a grown vocabulary) holds the
    weights `surgery interpolate` writes, bit for bit."""
    from surgery.api import interpolate
    from surgery.core.layers import LayerValues

    pairs = [made(arch) for arch in ("gemma3mm", "mistral3")]
    cases = [*((pair["base"], pair["trained"]) for pair in pairs), grown]
    for number, (base, trained) in enumerate(cases):
        load = lambda folder: (  # noqa: E731
            transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
            None,
        )
        blender = MemoryBlender(base, trained, load)
        blender.set_alphas(LayerValues(default=0.3), None)
        out = interpolate(base, trained, tmp_path / f"out{number}", "0.3", quiet=True)
        written = load_state(out)
        for name, param in blender.params.items():
            expected = written[name].float()
            assert torch.equal(param.detach(), expected), (number, name)


def test_grown_vocabulary_revert_copies_the_outside_from_trained(grown, tmp_path):
    base, trained = grown
    out = tmp_path / "out"
    result = run("revert", "--layers", "1:3", base, trained, out)
    assert result.exit_code == 0, result.output
    got, t, b = assert_valid_output(out), load_state(trained), load_state(base)
    for name, tensor in got.items():
        assert same_bits(tensor, b[name] if in_layers(name, (1, 2)) else t[name]), name
    rows = tiny_models.vocab_size()
    vocabulary = json.loads((out / "surgery_recipe.json").read_text())["matching"]["vocabulary"]
    assert vocabulary["rows"] == {"trained": rows + GROWN, "base": rows}
    assert "The vocabulary differs" in (out / "README.md").read_text()


@pytest.mark.parametrize("alpha", ["0", "0.5", "1"])
def test_grown_vocabulary_interpolates_the_shared_rows(grown, tmp_path, alpha):
    base, trained = grown
    out = tmp_path / "out"
    result = run("interpolate", "--alpha", alpha, base, trained, out)
    assert result.exit_code == 0, result.output
    got, t, b = assert_valid_output(out), load_state(trained), load_state(base)
    rows, a = tiny_models.vocab_size(), float(alpha)
    for name, tensor in got.items():
        assert tensor.shape == t[name].shape
        shared = b[name].shape[0] if b[name].shape != t[name].shape else None
        if shared is not None:  # the added rows are TRAINED's, bit for bit
            assert shared == rows and same_bits(tensor[shared:], t[name][shared:]), name
        ours, theirs, mine = tensor[:shared], b[name][:shared], t[name][:shared]
        if a in (0.0, 1.0):
            assert same_bits(ours, theirs if a == 0.0 else mine), name
        else:
            terms = [(1 - a) * theirs.double(), a * mine.double()]
            assert within_one_rounding(ours, terms), name
    loaded = tiny_models.LlamaForCausalLM.from_pretrained(out)
    assert loaded.get_input_embeddings().weight.shape[0] == rows + GROWN


def test_grown_vocabulary_drift_compares_the_shared_rows(grown):
    base, trained = grown
    report = drift(open_checkpoint(base), open_checkpoint(trained))
    t, b = load_state(trained), load_state(base)
    rows = tiny_models.vocab_size()
    head = report.tensors["lm_head.weight"]
    exact = (t["lm_head.weight"][:rows].double() - b["lm_head.weight"].double()).norm()
    assert head.relative_l2 == pytest.approx(float(exact / b["lm_head.weight"].double().norm()))
    assert head.numel == b["lm_head.weight"].numel()
    assert report.shared_rows["lm_head.weight"] == (rows, rows + GROWN, rows)
    assert f"lm_head.weight compared on the {rows} rows both have" in format_drift(report)


def test_soup_and_merge_refuse_different_vocabularies(grown, tmp_path):
    base, trained = grown
    result = run("soup", base, trained, tmp_path / "out")
    rows = tiny_models.vocab_size()
    assert_refused(result, f"[{rows}, 32] in expert 1", tmp_path)
    assert f"[{rows + GROWN}, 32] in expert 2" in result.stderr
    assert "vocabularies differ" in result.stderr
    config = tmp_path / "merge.yml"
    models = [{"model": str(p), "parameters": {"weight": 1.0}} for p in (base, trained)]
    config.write_text(json.dumps({"merge_method": "linear", "models": models}))
    assert_refused(run("merge", config, tmp_path / "out"), "vocabularies differ", tmp_path)


def test_other_shape_differences_stay_refused(grown, tmp_path):
    """Rows that are not the vocabulary's (a config that does not say so) are refused."""
    base, trained = grown
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    config = json.loads((copy / "config.json").read_text())
    config["vocab_size"] = tiny_models.vocab_size()  # the rows no longer are the vocabulary
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        MismatchError, match=r"has shape \[\d+, 32\] in trained but \[\d+, 32\] in base$"
    ):
        plan_interpolate(open_checkpoint(base), open_checkpoint(copy), 0.5)


def test_inspect_shows_the_matching(made):
    paths = made("gemma3mm")
    result = run("inspect", paths["trained"], paths["base"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    name = "model.layers.2.mlp.up_proj.weight"
    assert any(name in line and published_name(name) in line for line in lines)
    assert any("vision_tower.head.probe" in line and "no counterpart" in line for line in lines)
    data = json.loads(run("inspect", "--json", paths["trained"], paths["base"]).output)
    assert {"a": name, "b": published_name(name), "shapes": "same"} in data["tensors"]


def test_qwen2_5_vl_is_not_qwen2(tmp_path):
    """Qwen2.5-VL's text stack uses multimodal RoPE: not the same model as a Qwen2 text-only
    one of the same shapes, so they are refused as different architectures."""
    common = dict(
        vocab_size=tiny_models.vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=tiny_models.NUM_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(**common, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            fullatt_block_indexes=[1],
        ),
    )
    vl = tiny_models.save(transformers.Qwen2_5_VLForConditionalGeneration(config), tmp_path / "vl")
    text = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    qwen2 = tiny_models.save(text, tmp_path / "qwen2")
    result = run("revert", "--layers", "1:3", vl, qwen2, tmp_path / "out")
    assert_refused(result, "different architectures (qwen2, qwen2_5_vl_text)", tmp_path)


class WeightNorm:
    """A scorer (surgery never imports eval's): the squared norm of the weights, in float64."""

    def __init__(self) -> None:
        self.config = {"scorer": "weight norm"}

    def load(self, folder):
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), None

    def __call__(self, model, tokenizer, *, progress):
        return {
            "norm/sq": float(sum(p.detach().double().square().sum() for p in model.parameters()))
        }


@pytest.mark.parametrize("case", ["multimodal", "grown"])
def test_sweep_and_localize_in_memory_score_the_written_points(made, grown, tmp_path, case):
    from surgery.diagnostics.localize import run_localize
    from surgery.diagnostics.sweep import run_sweep

    base, trained = (
        (made("gemma3mm")["base"], made("gemma3mm")["trained"]) if case == "multimodal" else grown
    )
    norm = WeightNorm()
    rows = run_sweep(
        base, trained, tmp_path / "s", [0.0, 0.5], scorer=norm, in_memory=True, quiet=True
    )
    for row in rows:
        point = tmp_path / "s" / f"alpha-{row['alpha']:.2f}"
        assert row["norm/sq"] == norm(norm.load(point)[0], None, progress=False)["norm/sq"]
    result = run_localize(base, trained, norm, blocks="1:3", quiet=True)
    assert result.base["norm/sq"] == rows[0]["norm/sq"]
