"""Layer addressing: stack detection from real tensor names and the layer-spec parser."""

import json

import pytest
from safetensors.torch import load_file

from surgery.core.errors import LayerSpecError
from surgery.core.layers import (
    find_stacks,
    format_layers,
    layer_of,
    parse_layer_spec,
    parse_layer_values,
    select_stack,
    stack_layer,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.layers.12.self_attn.q_proj.weight", ("model.layers", 12)),
        ("language_model.model.layers.3.mlp.up_proj.weight", ("language_model.model.layers", 3)),
        ("model.language_model.layers.3.mlp.up_proj.weight", ("model.language_model.layers", 3)),
        (
            "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
            ("vision_tower.vision_model.encoder.layers", 0),
        ),
        ("transformer.h.7.attn.c_attn.weight", ("transformer.h", 7)),
        ("gpt_neox.layers.2.attention.dense.weight", ("gpt_neox.layers", 2)),
        ("bert.encoder.layer.11.output.dense.bias", ("bert.encoder.layer", 11)),
        ("model.layers.1.mlp.experts.5.w1.weight", ("model.layers", 1)),
        ("model.embed_tokens.weight", None),
        ("lm_head.weight", None),
    ],
)
def test_layer_of_real_architectures(name, expected):
    assert layer_of(name) == expected


def test_gemma3_multimodal_stacks_are_kept_apart():
    names = [f"language_model.model.layers.{i}.mlp.up_proj.weight" for i in range(34)]
    names += [f"vision_tower.vision_model.encoder.layers.{i}.mlp.fc1.weight" for i in range(27)]
    names += ["language_model.model.embed_tokens.weight"]
    stacks = find_stacks(names)
    assert [(s.name, s.num_layers) for s in stacks] == [("text", 34), ("vision", 27)]
    assert select_stack(stacks).prefix == "language_model.model.layers"
    assert select_stack(stacks, "vision").num_layers == 27
    with pytest.raises(LayerSpecError, match="no layer stack named 'audio'"):
        select_stack(stacks, "audio")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("9:28", list(range(9, 28))),
        ("-6:", list(range(28, 34))),
        ("0:9,28:34", [*range(9), *range(28, 34)]),
        ("5", [5]),
        ("-1", [33]),
        (":3", [0, 1, 2]),
        ("0:34:11", [0, 11, 22, 33]),
        ("2:4, 3:5", [2, 3, 4]),
    ],
)
def test_parse_layer_spec(spec, expected):
    assert parse_layer_spec(spec, 34) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("9:40", "outside the model's 34 layers"),
        ("34", "outside the model's 34 layers"),
        ("-35", "outside the model's 34 layers"),
        ("", "empty"),
        ("3,", "empty"),
        ("5:5", "selects no layers of the model's 34"),
        ("a:b", "not an integer"),
        ("1:2:3:4", "too many colons"),
        ("0:4:0", "step of zero"),
    ],
)
def test_parse_layer_spec_errors_name_the_layer_count(spec, message):
    with pytest.raises(LayerSpecError, match=message):
        parse_layer_spec(spec, 34)


def test_parse_layer_values():
    values = parse_layer_values("9:28=0.05,*=0.001", 34)
    assert values.value_for(9) == 0.05 and values.value_for(27) == 0.05
    assert values.value_for(28) == 0.001 and values.value_for(None) == 0.001
    shared = parse_layer_values("0:2,3=0.3", 4)
    assert shared.per_layer == {0: 0.3, 1: 0.3, 3: 0.3} and shared.default is None
    assert parse_layer_values("0.5", 4).value_for(2) == 0.5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0:3=1,2=2", "gives layer 2 twice"),
        ("*=1,*=2", "gives '\\*' twice"),
        ("0:3", "not a number"),
        ("0:2=1,3", "has no '=value'"),
        ("0:2=x", "not a number"),
        ("0:9=1", "outside the model's 4 layers"),
    ],
)
def test_parse_layer_values_errors(spec, message):
    with pytest.raises(LayerSpecError, match=message):
        parse_layer_values(spec, 4)


def test_format_layers_round_trips():
    for spec in ("9:28", "0:9,28:34", "5", "0,2,4"):
        assert parse_layer_spec(format_layers(parse_layer_spec(spec, 34)), 34) == parse_layer_spec(
            spec, 34
        )
    assert format_layers([0, 1, 2, 7]) == "0:3,7"


def _tiny_t5_names() -> list[str]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_heads=2, num_layers=3)
    config.num_decoder_layers = 2
    return list(T5ForConditionalGeneration(config).state_dict())


def test_t5_blocks_are_two_stacks_not_one_per_block():
    # `encoder.block.N.layer.M.`: the block is the layer; M numbers its sublayers.
    stacks = find_stacks(_tiny_t5_names())
    assert [(s.prefix, s.num_layers) for s in stacks] == [
        ("decoder.block", 2),
        ("encoder.block", 3),
    ]
    with pytest.raises(LayerSpecError, match="several layer stacks"):
        select_stack(stacks)
    assert select_stack(stacks, "encoder.block").num_layers == 3


def _tiny_qwen2_5_vl_names() -> list[str]:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    text |= dict(num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
    text["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 2, 4]}
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    return list(Qwen2_5_VLForConditionalGeneration(config).state_dict())


def test_qwen_vl_visual_blocks_are_the_vision_stack():
    # transformers 5's names (`model.visual.blocks.N.`) and the Hub checkpoints' older ones
    # (`visual.blocks.N.` beside `model.layers.N.`).
    hub = [f"visual.blocks.{i}.attn.qkv.weight" for i in range(32)]
    hub += [f"model.layers.{i}.mlp.up_proj.weight" for i in range(28)]
    hub += ["visual.merger.mlp.0.weight", "model.embed_tokens.weight", "lm_head.weight"]
    for names, text, vision in [(_tiny_qwen2_5_vl_names(), 2, 3), (hub, 28, 32)]:
        stacks = find_stacks(names)
        assert [(s.name, s.num_layers) for s in stacks] == [("text", text), ("vision", vision)]
        assert select_stack(stacks).num_layers == text
        assert select_stack(stacks, "vision").prefix.endswith("visual.blocks")


def test_layers_past_the_configs_count_are_outside_the_stack():
    # DeepSeek-V3: 61 layers and its multi-token-prediction layer `model.layers.61`.
    names = [f"model.layers.{i}.mlp.gate.weight" for i in range(62)]
    names += ["model.layers.61.eh_proj.weight", "model.embed_tokens.weight"]
    (stack,) = find_stacks(names, text_layers=61)
    assert (stack.num_layers, stack.beyond) == (61, 1)
    assert parse_layer_spec("-6:", stack.num_layers) == list(range(55, 61))
    assert stack_layer("model.layers.60.mlp.gate.weight", stack) == 60
    assert stack_layer("model.layers.61.eh_proj.weight", stack) is None
    assert find_stacks(names)[0].num_layers == 62  # no config: every numbered layer


def _deepseek_v3_with_mtp(folder, seed: int):
    """A tiny DeepSeek-V3 (3 layers) saved with a multi-token-prediction layer
    `model.layers.3.*` appended, as DeepSeek-V3's checkpoints carry one past their 61."""
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tests.support.tiny_models import make_tokenizer, perturb, vocab_size

    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=vocab_size(), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    )  # fmt: skip
    model = perturb(DeepseekV3ForCausalLM(config), seed)
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    state = model.state_dict()
    mtp = {k.replace("layers.2.", "layers.3."): v.clone() for k, v in state.items() if ".2." in k}
    gen = torch.Generator().manual_seed(seed)
    mtp["model.layers.3.eh_proj.weight"] = torch.randn(32, 64, generator=gen)
    save_file(mtp, folder / "mtp.safetensors", metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:  # one shard: give it an index that also lists the MTP shard
        names = list(load_file(folder / "model.safetensors"))
        index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    index["weight_map"] |= dict.fromkeys(mtp, "mtp.safetensors")
    index_path.write_text(json.dumps(index))
    return folder


def test_a_multi_token_prediction_layer_is_outside_the_stack(tmp_path):
    from tests.hostile.support import invoke
    from tests.support.checks import load_state, same_bits

    base = _deepseek_v3_with_mtp(tmp_path / "base", seed=1)
    trained = _deepseek_v3_with_mtp(tmp_path / "trained", seed=2)
    result = invoke("inspect", base)
    assert result.exit_code == 0, result.output
    assert "text: 3 layers (model.layers.N), and 1 past the config's count" in result.output
    assert "layers 3 of model.layers lie past config.json's num_hidden_layers (3)" in result.output
    result = invoke("revert", "-q", "--layers", "-1:", base, trained, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "layers 3 of model.layers lie past" in result.stderr
    ours, base_state = load_state(tmp_path / "out"), load_state(base)
    trained_state = load_state(trained)
    for name, values in ours.items():
        source = base_state if name.startswith("model.layers.2.") else trained_state
        assert same_bits(values, source[name]), name
    assert same_bits(
        ours["model.layers.3.eh_proj.weight"], trained_state["model.layers.3.eh_proj.weight"]
    )
