"""The merge config schema agrees with mergekit's own `MergeConfiguration`, config by config.

`surgery merge` checks configs without importing mergekit (whose import alone costs more than a
streamed linear merge); mergekit is the oracle here: every config it rejects is rejected, every
config it accepts is accepted (except unknown keys, which this tool refuses and mergekit ignores)
and read the same way (models, layer ranges, parameter values).
"""

from __future__ import annotations

import re

import pytest
import yaml

from surgery.engine.ops.merge.spec import Conditional, MergeConfigError
from surgery.mergekit_schema import validate

M = "merge_method: linear\n"
CORPUS = [
    M + "models: [{model: a}]\n",
    M + "models: [{model: a, parameters: {weight: 0.5}}, {model: b@main}]\n",
    M + "models: [{model: {model: {path: a, revision: r1}}}]\n",
    M + "models: [{model: a@b@c}]\n",
    M + "models: [{model: 3}]\n",
    M + "models: [{parameters: {weight: 1}}]\n",
    M + "models: []\n",
    M,
    "models: [{model: a}]\n",
    "merge_method: 5\nmodels: [{model: a}]\n",
    M + "models: a\n",
    M + "models: [a]\n",
    M + "models: [{model: a}]\nslices: [{sources: [{model: a, layer_range: [0, 2]}]}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0, 2]}]}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0.0, '2']}]}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0.5, 2]}]}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0, x]}]}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0, 1, 2]}]}]\n",
    M + "slices: [{sources: [{model: a, layer_range: 3}]}]\n",
    M + "slices: [{sources: [{model: a}]}]\n",
    M + "slices: [{sources: [{layer_range: [0, 2]}]}]\n",
    M + "slices: [{base_model: a}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0, 2]}], base_model: b}]\n",
    M + "slices: [{sources: [{model: a, layer_range: [0, 2], parameters: {t: [0, 1]}}]}]\n",
    M + "models: [{model: a, parameters: {weight: [0, 0.5, 1]}}]\n",
    M + "models: [{model: a, parameters: {weight: {value: 1, filter: mlp}}}]\n",
    M + "models: [{model: a, parameters: {weight: [{value: 1, filter: mlp}, {value: 0}]}}]\n",
    M + "models: [{model: a, parameters: {weight: [{value: [0, 1], filter: '*'}]}}]\n",
    M + "models: [{model: a, parameters: {weight: {filter: mlp}}}]\n",
    M + "models: [{model: a, parameters: {weight: {value: {value: 1}}}}]\n",
    M + "models: [{model: a, parameters: {weight: [[1, 2]]}}]\n",
    M + "models: [{model: a, parameters: {weight: [1, {value: 2}]}}]\n",
    M + "models: [{model: a, parameters: {weight: null}}]\n",
    M + "models: [{model: a, parameters: {weight: {value: 1, filter: 7}}}]\n",
    M + "models: [{model: a, parameters: [1]}]\n",
    M + "models: [{model: a, parameters: {weight: true, note: text, d: 1e-3}}]\n",
    M + "models: [{model: a}]\nparameters: {normalize: false, lambda: [1, 2]}\n",
    M + "models: [{model: a}]\nbase_model: b\n",
    M + "models: [{model: a}]\nbase_model: [b]\n",
    M + "models: [{model: a}]\ndtype: bfloat16\nout_dtype: float16\n",
    M + "models: [{model: a}]\ndtype: 16\n",
    M + "models: [{model: a}]\ntokenizer_source: base\n",
    M + "models: [{model: a}]\ntokenizer_source: 3\n",
    M + "models: [{model: a}]\nparameters: 0.5\n",
    # Tokenizers: tokenizer_source, the tokenizer: block and chat_template.
    M + "models: [{model: a}]\ntokenizer_source: union\nchat_template: chatml\n",
    M + "models: [{model: a}]\ntokenizer_source: b@main\n",
    M + "models: [{model: a}]\ntokenizer: {}\n",
    M
    + "models: [{model: a}]\ntokenizer: {source: b, pad_to_multiple_of: 8, tokens: {x: {source: a},"
    " y: {source: {kind: zero}}, z: {source: {kind: model_token, model: a, token: q}, force: true},"
    " w: {source: {kind: model_token, model: a, token_id: 3}}, v: {force: true}}}\n",
    M + "models: [{model: a}]\ntokenizer_source: union\ntokenizer: {source: base}\n",
    M + "models: [{model: a}]\ntokenizer: {tokens: {x: {source: {kind: one}}}}\n",
    M + "models: [{model: a}]\ntokenizer: {tokens: {x: {force: maybe}}}\n",
    M + "models: [{model: a}]\ntokenizer: {tokens: [x]}\n",
    M + "models: [{model: a}]\nchat_template: [x]\n",
    # mergekit's other seven methods, with their parameters.
    "merge_method: sce\nbase_model: a\nmodels: [{model: a}, {model: b}]\n"
    "parameters: {select_topk: 0.5, int8_mask: true}\n",
    "merge_method: sce\nmodels: [{model: a}]\nparameters: {select_topk: [0.1, {value: 1}]}\n",
    "merge_method: karcher\nmodels: [{model: a}, {model: b}]\n"
    "parameters: {max_iter: 20, tol: 1e-7}\n",
    "merge_method: multislerp\nmodels: [{model: a, parameters: {weight: 0.3}},"
    " {model: b, parameters: {weight: [0.1, 0.9]}}]\n"
    "parameters: {normalize_weights: false, eps: 1e-6}\n",
    "merge_method: nearswap\nbase_model: a\nmodels: [{model: a}, {model: b}]\n"
    "parameters: {t: [0.0001, 0.001]}\n",
    "merge_method: arcee_fusion\nbase_model: a\nmodels: [{model: a}, {model: b}]\n",
    "merge_method: ram\nbase_model: a\nmodels: [{model: b}, {model: c}]\n"
    "parameters: {epsilon: 1e-4}\n",
    "merge_method: ramplus_tl\nbase_model: a\n"
    "slices: [{sources: [{model: a, layer_range: [0, 2]}, {model: b, layer_range: [0, 2]}]}]\n"
    "parameters: {r: 0.2, alpha: {value: 0.3, filter: mlp}}\n",
    "merge_method: ramplus_tl\nbase_model: a\nmodels: [{model: b}]\nparameters: {r: {value: x}}\n",
]


def _mergekit_reading(data: dict) -> dict | None:
    """mergekit's validated config as plain data, or None when mergekit rejects it."""
    from mergekit.config import MergeConfiguration

    try:
        config = MergeConfiguration.model_validate(data)
    except Exception:
        return None
    return config.model_dump(mode="json", exclude_none=True)


def _ours(data: dict) -> dict | None:
    try:
        return validate(data)
    except MergeConfigError:
        return None


def _plain(setting: object) -> object:
    if isinstance(setting, Conditional):
        out = {"value": setting.value}
        return out if setting.filter is None else {**out, "filter": setting.filter}
    if isinstance(setting, list):
        return [_plain(s) for s in setting]
    return setting


def _plain_tokenizer(block: dict | None) -> dict | None:
    """Our reading of a `tokenizer:` block in the form mergekit dumps it."""
    if block is None:
        return None

    def source(value: dict | None) -> object:
        if value is None or value["kind"] == "model":
            return None if value is None else value["model"]
        return {k: v for k, v in value.items() if v is not None}

    tokens = {
        token: {
            k: v
            for k, v in {"source": source(e["source"]), "force": e["force"]}.items()
            if v is not None
        }
        for token, e in block["tokens"].items()
    }
    plain = {"source": block["source"], "tokens": tokens or None}
    plain["pad_to_multiple_of"] = block["pad_to_multiple_of"]
    return {k: v for k, v in plain.items() if v is not None}


def _same_reading(ours: dict, theirs: dict) -> None:
    assert ours["merge_method"] == theirs["merge_method"]
    for mine, their in zip(ours["models"] or [], theirs.get("models", []), strict=True):
        assert mine["model"] == their["model"]
        assert {k: _plain(v) for k, v in mine["parameters"].items()} == their.get("parameters", {})
    for mine, their in zip(ours["slices"] or [], theirs.get("slices", []), strict=True):
        for source, their_source in zip(mine["sources"], their["sources"], strict=True):
            assert source["model"] == their_source["model"]
            assert list(source["layer_range"]) == list(their_source["layer_range"])
    for key in ("base_model", "dtype", "out_dtype", "tokenizer_source", "chat_template"):
        assert ours[key] == theirs.get(key)
    assert _plain_tokenizer(ours["tokenizer"]) == theirs.get("tokenizer")
    assert {k: _plain(v) for k, v in ours["parameters"].items()} == theirs.get("parameters", {})


@pytest.mark.parametrize("text", CORPUS)
def test_schema_agrees_with_mergekit(text):
    data = yaml.safe_load(text)
    theirs, ours = _mergekit_reading(data), _ours(data)
    assert (ours is None) == (theirs is None), f"mergekit {'accepts' if theirs else 'rejects'}"
    if ours is not None:
        _same_reading(ours, theirs)


def test_corpus_has_both_outcomes():
    outcomes = [_ours(yaml.safe_load(text)) is None for text in CORPUS]
    assert 10 <= sum(outcomes) <= len(CORPUS) - 10


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (M + "models: [{model: a, weigth: 1}]\n", "models[0]: key 'weigth' is not supported"),
        (M + "models: [{model: a, parameters: {weight: {value: 1, filtr: x}}}]\n", "'filtr'"),
        (M + "slices: [{sources: [], residual_weight: 0.5}]\n", "residual_weight"),
        (M + "models: [{model: a+lora}]\n", "LoRA adapters"),
    ],
)
def test_stricter_than_mergekit_where_mergekit_ignores_or_we_cannot(text, message):
    with pytest.raises(MergeConfigError, match=re.escape(message)):
        validate(yaml.safe_load(text))


@pytest.mark.parametrize(
    "source",
    ["{kind: model_token, model: a}", "{kind: model_token, model: a, token: q, token_id: 1}"],
)
def test_a_broken_model_token_is_refused_not_read_as_a_model(source):
    # mergekit falls back to reading such a mapping as a plain model reference (its `model`
    # key), silently taking the token's own row in `a`; here it is an error.
    text = M + f"models: [{{model: a}}]\ntokenizer: {{tokens: {{x: {{source: {source}}}}}}}\n"
    with pytest.raises(MergeConfigError, match="token_id or token"):
        validate(yaml.safe_load(text))
