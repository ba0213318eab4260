"""`modules:` in `surgery merge`: a multimodal model's text decoder, vision tower and projector,
each merged from its own models with its own parameters (mergekit's OutputModuleDefinition).

Same-layout inputs have mergekit as the oracle; a multimodal base with text-only experts (which
mergekit refuses) is checked against the direct computation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from cli import cli
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, same_bits, ulp_distance
from tests.test_merge import mergekit_run, surgery_run
from tests.test_merge_schema import _mergekit_reading, _ours, _plain
from tests.test_merge_shapes import gemma3mm  # noqa: F401 (a fixture)

M = "merge_method: linear\n"
MODULE_CORPUS = [
    M + "modules: {text_decoder: {models: [{model: a}]}}\n",
    M + "modules: {text_decoder: {models: [{model: a, parameters: {weight: 2}}]}, "
    "vision_tower: {models: [{model: b}], parameters: {weight: 0.5}}}\n",
    M + "modules: {text_decoder: {slices: [{sources: [{model: a, layer_range: [0, 2]}]}]}}\n",
    M + "modules: {text_decoder: {}}\n",
    M + "modules: {text_decoder: {models: [{model: a}], slices: [{sources: []}]}}\n",
    M + "modules: {text_decoder: {models: []}}\n",
    M + "modules: []\n",
    M + "modules: {}\n",
    M + "modules: {t: {models: [{model: a}]}}\nmodels: [{model: a}]\n",
    M + "modules: {t: {models: [{model: a}], parameters: 3}}\n",
    M + "modules: {t: 5}\n",
]


@pytest.mark.parametrize("text", MODULE_CORPUS)
def test_the_modules_schema_agrees_with_mergekit(text):
    data = yaml.safe_load(text)
    theirs, ours = _mergekit_reading(data), _ours(data)
    assert (ours is None) == (theirs is None), f"mergekit {'accepts' if theirs else 'rejects'}"
    if ours is not None:
        assert set(ours["modules"]) == set(theirs["modules"])
        for name, module in ours["modules"].items():
            their = theirs["modules"][name]
            models = [(m["model"], m["parameters"]) for m in module["models"] or []]
            their_models = [(m["model"], m.get("parameters", {})) for m in their.get("models", [])]
            assert [(m, {k: _plain(v) for k, v in p.items()}) for m, p in models] == their_models
            assert {k: _plain(v) for k, v in module["parameters"].items()} == their.get(
                "parameters", {}
            )


def _module_config(paths: dict) -> dict:
    """task_arithmetic over the three modules, each with its own models and parameters."""
    e1, e2 = (str(p) for p in paths["experts"])
    return {
        "merge_method": "task_arithmetic",
        "base_model": str(paths["base"]),
        "dtype": "float32",
        "parameters": {"weight": 0.4},
        "modules": {
            "text_decoder": {
                "models": [
                    {"model": e1, "parameters": {"weight": 0.5}},
                    {"model": e2, "parameters": {"weight": [0.2, 0.8]}},
                ]
            },
            "vision_tower": {
                "models": [{"model": e1}, {"model": e2, "parameters": {"weight": 0.1}}],
                "parameters": {"weight": 0.9, "normalize": True},
            },
            "multi_modal_projector": {"models": [{"model": e2}]},
        },
    }


def test_modules_match_mergekit_per_module(gemma3mm, tmp_path):  # noqa: F811
    config = _module_config(gemma3mm)
    ours = assert_valid_output(surgery_run(config, tmp_path))
    theirs = mergekit_run(config, tmp_path / "mergekit")
    # mergekit leaves out the tensors its architecture file does not list (the vision head);
    # surgery merges them too, in their module.
    assert set(theirs) <= set(ours)
    ulps = {k: ulp_distance(ours[k], v) for k, v in theirs.items()}
    assert max(ulps.values()) <= 1, {k: u for k, u in ulps.items() if u > 1}
    # Each module got its own weights: the projector only e2's delta at the global weight.
    base, e2 = load_state(gemma3mm["base"]), load_state(gemma3mm["experts"][1])
    projector = "multi_modal_projector.mm_input_projection_weight"
    expected = base[projector] + 0.4 * (e2[projector] - base[projector])
    assert torch.allclose(ours[projector], expected, rtol=1e-6, atol=1e-7)


def _source(model: Path, lo: int, hi: int, weight: object) -> dict:
    return {"model": str(model), "layer_range": [lo, hi], "parameters": {"weight": weight}}


def _sliced_modules(paths: dict) -> dict:
    """linear with modules given `slices:`: 3 of the 4 text layers (two slices, a weight
    gradient in one), 3 vision layers from 2 (one taken twice), the projector by `models:`."""
    base, (e1, e2) = paths["base"], paths["experts"]
    return {
        "merge_method": "linear",
        # float32 arithmetic rounded once to bf16: mergekit rounds each float32 operation of
        # its weighted sum, so results near 0 differ by many float32 ulps.
        "dtype": "float32",
        "out_dtype": "bfloat16",
        "modules": {
            "text_decoder": {
                "slices": [
                    {"sources": [_source(e1, 0, 2, 0.7), _source(e2, 1, 3, [0.2, 0.8])]},
                    {"sources": [_source(base, 3, 4, 1.0)]},
                ],
                "parameters": {"normalize": True},
            },
            "vision_tower": {
                "slices": [
                    {"sources": [_source(e2, 1, 2, 1.0)]},
                    {"sources": [_source(e1, 0, 2, 0.5), _source(base, 0, 2, 0.5)]},
                ]
            },
            "multi_modal_projector": {"models": [{"model": str(e1), "parameters": {"weight": 1}}]},
        },
    }


def test_modules_with_slices_match_mergekit(gemma3mm, tmp_path):  # noqa: F811
    config = _sliced_modules(gemma3mm)
    ours = assert_valid_output(surgery_run(config, tmp_path))
    theirs = mergekit_run(config, tmp_path / "mergekit")
    assert set(theirs) <= set(ours)  # mergekit leaves the vision head out (see above)
    ulps = {k: ulp_distance(ours[k], v) for k, v in theirs.items()}
    assert max(ulps.values()) <= 1, {k: u for k, u in ulps.items() if u > 1}
    # The layers were renumbered: 3 text layers, 3 vision layers; configs agree on it.
    configs = [
        json.loads((f / "config.json").read_text())
        for f in (tmp_path / "ours", tmp_path / "mergekit")
    ]
    for config_json in configs:
        assert config_json["text_config"]["num_hidden_layers"] == 3
        assert config_json["vision_config"]["num_hidden_layers"] == 3
    # Layer 2 of the text decoder is the base's layer 3, and vision layer 0 is e2's layer 1.
    base, e2 = load_state(gemma3mm["base"]), load_state(gemma3mm["experts"][1])
    text, vision = "language_model.model.layers.", "vision_tower.vision_model.encoder.layers."
    suffix = "mlp.down_proj.weight"
    bf16 = torch.bfloat16
    assert same_bits(ours[f"{text}2.{suffix}"], base[f"{text}3.{suffix}"].to(bf16))
    assert same_bits(ours[f"{vision}0.mlp.fc1.weight"], e2[f"{vision}1.mlp.fc1.weight"].to(bf16))
    assert f"{text}3.{suffix}" not in ours


def test_a_module_without_layers_takes_empty_slices(gemma3mm, tmp_path):  # noqa: F811
    config = _sliced_modules(gemma3mm)
    e1 = gemma3mm["experts"][0]
    projector = {"slices": [{"sources": [_source(e1, 0, 0, 1.0)]}]}
    config["modules"]["multi_modal_projector"] = projector
    ours = assert_valid_output(surgery_run(config, tmp_path))
    theirs = mergekit_run(config, tmp_path / "mergekit")
    names = [n for n in theirs if n.startswith("multi_modal_projector.")]
    assert names and all(same_bits(ours[n], theirs[n]) for n in names)
    projector["slices"][0]["sources"][0]["layer_range"] = [0, 1]
    (tmp_path / "bad").mkdir()
    _refused(tmp_path / "bad", config, "of a module without layers (give [0, 0])")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> dict[str, Path]:
    """A multimodal base (published naming) and two text-only fine-tunes of its text model."""
    root = tmp_path_factory.mktemp("mixed")
    model = tiny_models.build_model("gemma3mm")
    paths = {"base": tiny_models.save(model, root / "base")}
    for name, seed in (("trained", 100), ("expert", 101)):
        text = tiny_models.perturb(tiny_models.text_only(model), seed=seed)
        paths[name] = tiny_models.save(text, root / name)
    return paths


def _published(text_name: str) -> str:
    if text_name.startswith("lm_head."):
        return "language_model." + text_name
    return "language_model.model." + text_name.removeprefix("model.")


def _mixed_config(paths: dict, method: str, text_models: list[str]) -> dict:
    """The vision tower and projector from the base, the text decoder from `text_models`, each
    at weight 1 (passthrough takes no weight)."""

    def entry(name: str) -> dict:
        weight = {} if method == "passthrough" else {"parameters": {"weight": 1.0}}
        return {"model": str(paths[name]), **weight}

    return {
        "merge_method": method,
        "modules": {
            "vision_tower": {"models": [entry("base")]},
            "multi_modal_projector": {"models": [entry("base")]},
            "text_decoder": {"models": [entry(n) for n in text_models]},
        },
    }


@pytest.mark.parametrize(
    ("method", "text_models"), [("linear", ["trained", "expert"]), ("passthrough", ["trained"])]
)
def test_a_multimodal_base_with_text_only_experts(mixed, tmp_path, method, text_models):
    config = _mixed_config(mixed, method, text_models)
    got = assert_valid_output(surgery_run(config, tmp_path))
    base = load_state(mixed["base"])
    texts = {n: load_state(mixed[n]) for n in text_models}
    assert got.keys() == base.keys()
    text_names = {_published(n): n for n in texts[text_models[0]]}
    assert set(text_names) | {n for n in base if not n.startswith("language_model.")} == set(base)
    for name, tensor in got.items():
        if name not in text_names:
            assert same_bits(tensor, base[name]), name  # vision tower and projector untouched
            continue
        inputs = [texts[n][text_names[name]].float() for n in text_models]
        expected = (sum(inputs) / len(inputs)).to(torch.bfloat16)
        assert same_bits(tensor, expected), name
    config_json = (tmp_path / "ours" / "config.json").read_text()
    assert "Gemma3ForConditionalGeneration" in config_json


def _refused(tmp_path: Path, config: dict, message: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(cli, ["merge", str(path), str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_module_the_architecture_lacks_is_one_line(mixed, tmp_path):
    config = _mixed_config(mixed, "linear", ["trained"])
    config["modules"]["audio_tower"] = config["modules"]["vision_tower"]
    _refused(tmp_path, config, "modules: audio_tower is not a module of model")
    _refused(tmp_path, config, "(its modules: text_decoder, multi_modal_projector, vision_tower)")


def test_a_text_only_output_has_one_module(mixed, tmp_path):
    models = [{"model": str(mixed["trained"]), "parameters": {"weight": 1.0}}]
    config = {"merge_method": "linear", "modules": {"vision_tower": {"models": models}}}
    _refused(tmp_path, config, "vision_tower is not a module of model")
    config["modules"] = {"default": {"models": models}}
    got = assert_valid_output(surgery_run(config, tmp_path))
    assert all(same_bits(t, load_state(mixed["trained"])[n]) for n, t in got.items())


def test_every_module_must_be_named(mixed, tmp_path):
    config = _mixed_config(mixed, "linear", ["trained"])
    del config["modules"]["vision_tower"]
    _refused(tmp_path, config, "modules: vision_tower of model")


def test_a_vision_tower_from_a_text_only_model_is_refused(mixed, tmp_path):
    config = _mixed_config(mixed, "linear", ["trained"])
    config["modules"]["vision_tower"]["models"].append(
        {"model": str(mixed["expert"]), "parameters": {"weight": 1.0}}
    )
    _refused(tmp_path, config, "(module vision_tower)")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base_model: a\ngate_mode: hidden\nexperts: [{source_model: b}]\n", "mergekit-moe"),
        ("base_model: a\nexperts: [{source_model: b, positive_prompts: [x]}]\n", "mergekit-moe"),
        (
            M + "slices: [{sources: [{model: a, layer_range: [0, 1]}], residual_weight: 1}]\n",
            "resi",
        ),
        (M + "models: [{model: a+adapter}]\n", "mergekit-yaml applies them"),
    ],
)
def test_what_stays_refused_is_one_line(tmp_path, text, message):
    path = tmp_path / "c.yml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["merge", str(path), str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_grafted_text_decoder_loads_and_computes_as_the_fine_tune(mixed, tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3ForConditionalGeneration

    out = surgery_run(_mixed_config(mixed, "passthrough", ["trained"]), tmp_path)
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        merged = Gemma3ForConditionalGeneration.from_pretrained(out)(input_ids=ids).logits
        trained = Gemma3ForCausalLM.from_pretrained(mixed["trained"])(input_ids=ids).logits
    assert torch.equal(merged, trained)
