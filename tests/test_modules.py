"""--modules: one filter narrowing the layers of revert, interpolate, sweep, localize, freeze and
L2-SP; bit-exact on tiny real checkpoints, with mergekit replaying the equivalent configs."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from click.testing import CliRunner

from cli import cli
from surgery import api
from surgery.api import interpolate, revert
from surgery.core.errors import LayerSpecError
from surgery.core.modules import parse_module_filter
from tests.support.checks import load_state, same_bits, text_layer, ulp_distance
from tests.support.train_helpers import load_tensors, tiny_config, write_corpus

# The test's own reading of each architecture's layer: the first part of a tensor's name inside
# its layer, by module kind (norms between the blocks are in no group).
FIRST_PART = {
    "llama": {"self_attn": "attn", "mlp": "mlp"},
    "gemma3": {"self_attn": "attn", "mlp": "mlp"},
    "gemma3mm": {"self_attn": "attn", "mlp": "mlp"},
    "gpt2": {"attn": "attn", "mlp": "mlp"},
    "bert": {"attention": "attn", "intermediate": "mlp", "output": "mlp"},
}


def _group(arch: str, name: str, names) -> str | None:
    """attn, mlp or None for a tensor of the text stack; "outside" for one outside it."""
    layer = text_layer(name, names)
    if layer is None:
        return "outside"
    inner = name.split(f".{layer}.", 1)[1]
    return FIRST_PART[arch].get(inner.split(".")[0])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "bert"])
@pytest.mark.parametrize("modules", ["attn", "mlp"])
def test_revert_takes_only_the_named_modules_of_the_named_layers(families, tmp_path, arch, modules):
    paths = families(arch)
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    out = revert(
        paths["base"], paths["trained"], tmp_path / "o", "1:3", modules=modules, quiet=True
    )
    got = load_state(out)
    reverted = 0
    for name in trained:
        from_base = text_layer(name, trained) in (1, 2) and _group(arch, name, trained) == modules
        reverted += from_base
        assert same_bits(got[name], base[name] if from_base else trained[name]), name
        assert not torch.equal(base[name], trained[name]) or name.endswith("position_ids")
    assert reverted > 0
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert recipe["modules"] == modules and recipe["layers"] == "1:3"


def test_norms_between_blocks_are_in_neither_group_and_a_regex_picks_names():
    for inner in ("input_layernorm.weight", "post_feedforward_layernorm.weight", "ln_1.weight"):
        assert not parse_module_filter("attn,mlp").matches(inner)
    assert parse_module_filter("attn").matches("self_attn.q_norm.weight")  # inside attention
    assert parse_module_filter("attn").matches("attention.output.LayerNorm.weight")  # BERT
    assert parse_module_filter("mlp").matches("output.LayerNorm.weight")  # BERT's FFN output
    regex = parse_module_filter("q_proj|v_proj")
    assert regex.matches("self_attn.v_proj.weight") and not regex.matches("self_attn.k_proj.weight")


def test_interpolate_blends_only_the_named_modules(families, tmp_path):
    paths = families("llama")
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    ranged = load_state(
        interpolate(
            paths["base"],
            paths["trained"],
            tmp_path / "a",
            "1:3=0.5,*=0",
            modules="attn",
            quiet=True,
        )
    )
    only = load_state(
        interpolate(
            paths["base"],
            paths["trained"],
            tmp_path / "b",
            0.5,
            layers="1:3",
            modules="mlp",
            quiet=True,
        )
    )
    for name in trained:
        layer, group = text_layer(name, trained), _group("llama", name, trained)
        half = ((base[name].float() + trained[name].float()) / 2).to(trained[name].dtype)
        if layer in (1, 2) and group == "attn":
            assert ulp_distance(ranged[name], half) <= 1, name
        else:  # as an unnamed layer: the `*` alpha
            assert same_bits(ranged[name], base[name]), name
        if layer in (1, 2) and group == "mlp":
            assert ulp_distance(only[name], half) <= 1, name
        else:
            assert same_bits(only[name], trained[name]), name


@pytest.mark.parametrize(
    "command",
    [
        ["revert", "--layers", "0:2", "--modules", "mlp"],
        ["interpolate", "--alpha", "1:3=0.3,*=0.8", "--modules", "attn"],
        ["interpolate", "--alpha", "0.4", "--layers", "1", "--modules", "q_proj|down_proj"],
    ],
)
def test_the_mergekit_config_of_a_filtered_output_reproduces_it(families, tmp_path, command):
    from tests.test_merge import max_ulps, mergekit_run

    paths = families("llama")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, [*command, str(paths["base"]), str(paths["trained"]), str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    config_path = out / "mergekit_config.yml"
    config = yaml.safe_load(config_path.read_text())
    assert any("filter" in str(m["parameters"]) for m in config["models"])
    original = load_state(out)
    replay = load_state(api.merge(config_path, tmp_path / "replay", quiet=True))
    assert all(same_bits(original[k], replay[k]) for k in original)
    theirs = mergekit_run(config, tmp_path / "mergekit")
    ulps = max_ulps(original, theirs)
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["revert", "--layers", "1:3", "--modules", "mpl"], "matches no tensor of layers 1:3"),
        (["revert", "--layers", "1:3", "--modules", "mlp["], "is not a valid regex"),
        (["revert", "--layers", "1:3", "--modules", " "], "--modules is empty"),
        (["interpolate", "--alpha", "0.5", "--modules", "mlp"], "--modules narrows layers"),
    ],
)
def test_a_bad_filter_is_a_one_line_error_that_writes_nothing(families, tmp_path, args, message):
    paths = families("llama")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [*args, str(paths["base"]), str(paths["trained"]), str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_freeze_with_modules_keeps_only_those_modules_bit_identical(families, tmp_path):
    from train.api import train

    corpus = str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))
    base = families("llama")["base"]
    out = train(tiny_config(base, tmp_path / "out", [corpus], freeze="1:3", modules="mlp"))
    before, after = load_tensors(base), load_tensors(out)
    frozen = [
        n for n in before if text_layer(n, before) in (1, 2) and _group("llama", n, before) == "mlp"
    ]
    assert frozen and all(same_bits(before[n], after[n]) for n in frozen)
    moved = [n for n in before if n not in frozen]
    assert all(not same_bits(before[n], after[n]) for n in moved)
    record = json.loads((out / "surgery_train.json").read_text())
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert record["config"]["modules"] == recipe["config"]["modules"] == "mlp"


def test_l2sp_with_modules_regularizes_only_those_modules(families, tmp_path, monkeypatch):
    from train.api import train
    from train.strategies.l2sp import L2SP

    made = []
    original = L2SP.from_model.__func__

    def capture(cls, *args, **kwargs):
        made.append(original(cls, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(L2SP, "from_model", classmethod(capture))
    corpus = str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))
    base = families("llama")["base"]
    train(tiny_config(base, tmp_path / "out", [corpus], l2sp="1:3=5,*=0.5", modules="attn"))
    names = list(load_tensors(base))
    strengths = {t.name: t.strength for t in made[0].terms}
    assert set(strengths) == set(names)  # every tensor: 5 in the named modules, 0.5 elsewhere
    for name, strength in strengths.items():
        named = text_layer(name, names) in (1, 2) and _group("llama", name, names) == "attn"
        assert strength == (5.0 if named else 0.5), name


def test_train_refuses_modules_without_layers(families, tmp_path):
    from train.errors import TrainConfigError

    corpus = str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=10))
    base = families("llama")["base"]
    with pytest.raises(TrainConfigError, match="--modules narrows layers"):
        tiny_config(base, tmp_path / "out", [corpus], modules="mlp", l2sp="0.1").validate()
    with pytest.raises(LayerSpecError, match="matches no tensor"):
        tiny_config(base, tmp_path / "out", [corpus], modules="nothing", freeze="1").validate()


def test_localize_accepts_modules_and_records_them(families, tmp_path):
    from eval.scorer import TaskScorer
    from surgery.diagnostics.localize import run_localize
    from surgery.diagnostics.memory_blend import MemoryBlender

    paths = families("llama")
    task = TaskScorer.of(["ppl:tests/data/eval/held_out.txt"])
    result = run_localize(
        paths["base"],
        paths["trained"],
        task,
        blocks="1:3",
        modules="mlp",
        out_dir=tmp_path / "l",
        quiet=True,
    )
    assert [r["block"] for r in result.rows] == ["1:3"]
    assert json.loads((tmp_path / "l" / "localize.json").read_text())["config"]["modules"] == "mlp"
    # The block's blend is the filtered revert's weights, bit for bit.
    blender = MemoryBlender(paths["base"], paths["trained"], task.load)
    from surgery.core.layers import LayerValues

    blender.set_alphas(
        LayerValues(per_layer={1: 0.0, 2: 0.0}), blender.stack(None), parse_module_filter("mlp")
    )
    reverted = load_state(
        revert(paths["base"], paths["trained"], tmp_path / "r", "1:3", modules="mlp", quiet=True)
    )
    for name, param in blender.params.items():
        assert same_bits(param.detach().to(reverted[name].dtype), reverted[name]), name
    with pytest.raises(LayerSpecError, match="matches no tensor"):
        run_localize(paths["base"], paths["trained"], task, blocks="1:3", modules="xyz", quiet=True)


def test_sweep_with_modules_agrees_in_memory_and_written(families, tmp_path):
    from eval.scorer import TaskScorer
    from surgery.diagnostics.sweep import run_sweep

    paths = families("gemma3")
    task = TaskScorer.of(["ppl:tests/data/eval/held_out.txt"])
    common = dict(layers="1:3", modules="attn", scorer=task, quiet=True)
    memory = run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "m",
        [0.0, 0.5],
        save=False,
        in_memory=True,
        **common,
    )
    written = run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "w",
        [0.0, 0.5],
        save=True,
        in_memory=False,
        **common,
    )
    assert memory == written
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    zero = load_state(tmp_path / "w" / "alpha-0.00")
    for name, tensor in zero.items():
        named = text_layer(name, zero) in (1, 2) and _group("gemma3", name, zero) == "attn"
        assert same_bits(tensor, base[name] if named else trained[name]), name
    assert json.loads((tmp_path / "w" / "sweep.json").read_text())["config"]["modules"] == "attn"


def test_the_dry_run_counts_what_modules_leave_trained_and_regularized(families, tmp_path):
    from tests.support.tiny_models import build_model
    from train.memory_plan import count_parameters

    base = families("llama")["base"]
    sizes = {n: p.numel() for n, p in build_model("llama").named_parameters()}

    def mlp(layers):
        return sum(v for n, v in sizes.items() if text_layer(n, sizes) in layers and ".mlp." in n)

    config = tiny_config(base, tmp_path / "o", [], freeze="0", modules="mlp", l2sp="1:3=1,*=0")
    counts = count_parameters(build_model("llama"), config)
    assert counts.trained == counts.total - mlp({0})  # layer 0's attention and norms still train
    assert counts.regularized == mlp({1, 2})  # lambda 1 on those MLPs only, 0 elsewhere


def test_mergekit_filters_are_left_out_when_a_substring_would_catch_more():
    from surgery.core.layers import find_stacks
    from surgery.engine.ops.merge.equivalent import _module_filters

    names = [
        "model.layers.0.mlp.up.weight",
        "model.layers.0.mlp.up.weight_scale",  # contains the first; `up\.weight$` leaves it out
        "model.layers.0.self_attn.q.weight",
    ]
    stack = find_stacks(names)[0]
    groups = _module_filters(names, stack, [0], parse_module_filter("mlp"))
    assert groups == {0: ["model.layers.0.mlp."]}
    assert _module_filters(names, stack, [0], parse_module_filter(r"up\.weight$")) is None
    exact = _module_filters(names, stack, [0], parse_module_filter("q"))
    assert exact == {0: ["model.layers.0.self_attn.q.weight"]}
