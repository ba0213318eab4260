"""Layer addressing: stack detection from real tensor names and the layer-spec parser."""

import pytest

from surgery.core.errors import LayerSpecError
from surgery.core.layers import (
    find_stacks,
    format_layers,
    layer_of,
    parse_layer_spec,
    parse_layer_values,
    select_stack,
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
