"""revert, soup and interpolate on tiny real checkpoints: the engine's invariants, bit for bit."""

import json

import pytest
import torch
from mergekit.merge_methods import merge_tensors

from surgery.api import interpolate, revert, soup
from surgery.core.errors import LayerSpecError, MismatchError, SurgeryError
from tests.support.checks import (
    assert_valid_output,
    load_state,
    same_bits,
    text_layer,
    ulp_distance,
)
from tests.support.tiny_models import ARCHS


@pytest.mark.parametrize("arch", ARCHS)
def test_revert_changes_only_those_layers(families, tmp_path, arch):
    paths = families(arch)
    out = revert(paths["base"], paths["trained"], tmp_path / "out", "1:3", quiet=True)
    got = assert_valid_output(out)
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    assert got.keys() == trained.keys()
    for name, tensor in got.items():
        reverted = text_layer(name, got) in (1, 2)
        assert same_bits(tensor, base[name] if reverted else trained[name]), name
    assert sum(text_layer(n, got) in (1, 2) for n in got) > 0
    # Companion files come from TRAINED; the recipe records the operation.
    assert (out / "config.json").read_text() == (paths["trained"] / "config.json").read_text()
    assert (out / "tokenizer.json").is_file()
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert recipe["operation"] == "revert" and recipe["layers"] == "1:3"


def test_revert_leaves_vision_tower_unless_asked(families, tmp_path):
    paths = families("gemma3mm")
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    text = load_state(revert(paths["base"], paths["trained"], tmp_path / "t", "0:4", quiet=True))
    vision = load_state(
        revert(paths["base"], paths["trained"], tmp_path / "v", "0:1", stack="vision", quiet=True)
    )
    for name in trained:
        is_vision = name.startswith("vision_tower.")
        in_text = name.startswith("language_model.model.layers.")
        assert same_bits(text[name], base[name] if in_text else trained[name]), name
        in_vision_0 = name.startswith("vision_tower.encoder.layers.0.")
        assert same_bits(vision[name], base[name] if in_vision_0 else trained[name]), name
        if is_vision and not in_text:
            assert same_bits(text[name], trained[name])


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("weights", [None, [1, 2, 1]])
def test_soup_of_identical_checkpoints_is_identical(families, tmp_path, arch, weights):
    trained = families(arch)["trained"]
    out = soup([trained, trained, trained], tmp_path / "out", weights, quiet=True)
    got, expected = assert_valid_output(out), load_state(trained)
    assert all(same_bits(got[n], expected[n]) for n in expected)


def test_soup_is_order_independent_up_to_summation_order(families, tmp_path):
    experts = families("llama")["experts"]
    a = load_state(soup(experts, tmp_path / "a", quiet=True))
    b = load_state(soup(experts[::-1], tmp_path / "b", quiet=True))
    assert max(ulp_distance(a[n], b[n]) for n in a) <= 1


def assert_mergekit_close(tensor, expected, name):
    """Within one unit in the last place for 16-bit outputs. For float32 inputs we accumulate in
    float64 and mergekit in float32, so near-cancelling sums differ by more ulps than that; there
    the check is float32's own tolerance."""
    if tensor.element_size() == 2:
        assert ulp_distance(tensor, expected) <= 1, name
    else:
        torch.testing.assert_close(tensor, expected, msg=name)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3mm"])
def test_soup_matches_mergekit_linear(families, tmp_path, arch):
    experts = families(arch)["experts"]
    weights = [1.0, 2.0, 1.0]
    got = load_state(soup(experts, tmp_path / "out", weights, quiet=True))
    states = [load_state(e) for e in experts]
    for name, tensor in got.items():
        expected = merge_tensors(
            [s[name] for s in states], "linear", parameters={"weight": weights}
        )
        assert_mergekit_close(tensor, expected, name)


def test_soup_copies_agreeing_non_float_and_refuses_differing(families, tmp_path):
    experts = families("bert")["experts"]
    got = load_state(soup(experts, tmp_path / "ok", quiet=True))
    ids = got["bert.embeddings.position_ids"]
    assert ids.dtype == torch.int64 and torch.equal(ids, torch.arange(128)[None])

    import shutil

    from safetensors.torch import load_file, save_file

    odd = tmp_path / "odd"
    shutil.copytree(experts[1], odd)
    shard = sorted(odd.glob("*.safetensors"))[-1]
    tensors = load_file(shard)
    tensors["bert.embeddings.position_ids"] = tensors["bert.embeddings.position_ids"].flip(-1)
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(MismatchError, match="non-float tensor 'bert.embeddings.position_ids'"):
        soup([experts[0], odd], tmp_path / "bad", quiet=True)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("arch", ARCHS)
def test_interpolate_endpoints_are_bit_exact(families, tmp_path, arch):
    paths = families(arch)
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    zero = load_state(interpolate(paths["base"], paths["trained"], tmp_path / "0", 0.0, quiet=True))
    one = load_state(interpolate(paths["base"], paths["trained"], tmp_path / "1", "1", quiet=True))
    assert all(same_bits(zero[n], base[n]) for n in base)
    assert all(same_bits(one[n], trained[n]) for n in trained)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_interpolate_matches_mergekit_linear(families, tmp_path, arch):
    paths = families(arch)
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    got = load_state(interpolate(paths["base"], paths["trained"], tmp_path / "o", 0.3, quiet=True))
    for name, tensor in got.items():
        expected = merge_tensors(
            [base[name], trained[name]], "linear", parameters={"weight": [0.7, 0.3]}
        )
        assert_mergekit_close(tensor, expected, name)


def test_interpolate_layer_ranges(families, tmp_path):
    paths = families("llama")
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    only = load_state(
        interpolate(paths["base"], paths["trained"], tmp_path / "a", 0.5, layers="1:3", quiet=True)
    )
    ranged = load_state(
        interpolate(paths["base"], paths["trained"], tmp_path / "b", "1:3=0.5,*=0", quiet=True)
    )
    for name in trained:
        layer = text_layer(name, trained)
        half = ((base[name].float() + trained[name].float()) / 2).to(trained[name].dtype)
        if layer in (1, 2):
            assert ulp_distance(only[name], half) <= 1 and ulp_distance(ranged[name], half) <= 1
        else:
            assert same_bits(only[name], trained[name]), name
            assert same_bits(ranged[name], base[name]), name


def test_interpolate_refuses_ranges_with_layers(families, tmp_path):
    paths = families("llama")
    with pytest.raises(LayerSpecError, match="not both"):
        interpolate(paths["base"], paths["trained"], tmp_path / "o", "1:3=0.5", layers="0:2")


ARCH_CLASSES = {
    "llama": "AutoModelForCausalLM",
    "gemma3": "AutoModelForCausalLM",
    "gemma3mm": "Gemma3ForConditionalGeneration",
    "gpt2": "AutoModelForCausalLM",
    "bert": "BertForMaskedLM",
}


def _memory_key(name: str) -> str:
    """Gemma-3 multimodal's on-disk key -> its in-memory key (transformers 5 nests under model.)."""
    for prefix in ("language_model.model.", "vision_tower.", "multi_modal_projector."):
        if name.startswith(prefix):
            return "model." + name.replace("language_model.model.", "language_model.", 1)
    return name


def _logits(model_class, path=None, state=None, template=None):
    import transformers

    cls = getattr(transformers, model_class)
    model = cls.from_pretrained(template or path)
    if state is not None:
        # Non-float tensors (BERT's position_ids) are not model state in transformers 5.
        state = {_memory_key(k): v for k, v in state.items() if v.is_floating_point()}
        result = model.load_state_dict(state, strict=False)
        assert not result.unexpected_keys, result.unexpected_keys[:3]
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.arange(3, 19)[None]).logits


@pytest.mark.parametrize("arch", ARCHS)
def test_outputs_load_and_match_in_memory_operations(families, tmp_path, arch):
    """from_pretrained on each output gives the logits of the same operation done on state dicts."""
    paths = families(arch)
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    experts = [load_state(e) for e in paths["experts"]]
    memory = {
        "revert": {n: base[n] if text_layer(n, base) == 2 else t for n, t in trained.items()},
        "interpolate": {
            n: t
            if not t.is_floating_point()
            else (0.75 * base[n].float() + 0.25 * t.float()).to(t.dtype)
            for n, t in trained.items()
        },
        "soup": {
            n: t
            if not t.is_floating_point()
            else (sum(e[n].float() for e in experts) / 3).to(t.dtype)
            for n, t in experts[0].items()
        },
    }
    outputs = {
        "revert": revert(paths["base"], paths["trained"], tmp_path / "r", "2", quiet=True),
        "interpolate": interpolate(
            paths["base"], paths["trained"], tmp_path / "i", 0.25, quiet=True
        ),
        "soup": soup(paths["experts"], tmp_path / "s", quiet=True),
    }
    for op, out in outputs.items():
        got = _logits(ARCH_CLASSES[arch], out)
        expected = _logits(ARCH_CLASSES[arch], state=memory[op], template=paths["trained"])
        torch.testing.assert_close(got, expected, msg=f"{arch} {op}")


def test_dtype_override_and_sharding(families, tmp_path):
    paths = families("llama")
    out = revert(
        paths["base"],
        paths["trained"],
        tmp_path / "o",
        "0",
        dtype="F32",
        max_shard_size=30_000,
        quiet=True,
    )
    got, trained = assert_valid_output(out), load_state(paths["trained"])
    assert len(list(out.glob("*.safetensors"))) > 3
    assert all(t.dtype == torch.float32 for t in got.values())
    name = "model.layers.3.mlp.up_proj.weight"
    assert torch.equal(got[name], trained[name].float())
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_mismatched_checkpoints_are_refused(families, tmp_path):
    with pytest.raises(MismatchError, match=r"different architectures \(gemma3_text, llama\)"):
        revert(families("llama")["base"], families("gemma3")["trained"], tmp_path / "o", "1")
    with pytest.raises(SurgeryError, match="at least two"):
        soup([families("llama")["base"]], tmp_path / "o")
    assert not (tmp_path / "o").exists()
