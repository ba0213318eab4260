"""Merges of models whose vocabularies differ, with mergekit 0.1.5 as the oracle.

Each expert adds tokens of its own script to the tiny tokenizer and grows its embeddings (as
language adaptation does). mergekit runs in process on the same YAML; its `referenced_models`
is a Python set, whose order (the union's order of added tokens) changes from process to
process, so the oracle runs with it pinned to the config's order, which is the order this tool
uses. Every tensor must agree within 1 float32 ulp, and the tokenizers token for token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from cli import cli
from surgery import api
from tests.support import tiny_models
from tests.support.checks import load_state, ulp_distance

# Tokens each expert adds (its "script"); the shared one is added by two experts, in another
# order, so the union must line it up by token, not by id.
DEVANAGARI = ["नमस्ते", "दुनिया", "भाषा", "shared_tok"]
CYRILLIC = ["shared_tok", "привет", "мир", "язык"]
# Same count of added tokens as DEVANAGARI, other tokens: equal-size vocabularies that differ.
GREEK = ["γειά", "κόσμος", "γλώσσα", "λέξη"]


def _expert(arch: str, path: Path, tokens: list[str], seed: int) -> Path:
    """The tiny model trained (seeded noise) with `tokens` added and rows grown for them."""
    tokenizer = tiny_models.make_tokenizer()
    tokenizer.add_tokens(tokens)
    model = tiny_models.build_model(arch)
    if arch == "gemma3mm":
        model = tiny_models.text_only(model)
    # float32 noise: TIES's magnitude thresholds on bf16 deltas tie too often to compare.
    model = tiny_models.perturb(model.float(), seed=seed)
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        out = model.get_output_embeddings()
        params = {id(p): p for p in (model.get_input_embeddings().weight, out.weight)}
        for param in params.values():
            param[old:] = (torch.randn(param[old:].shape, generator=gen) * 0.05).to(param.dtype)
    model.save_pretrained(path, max_shard_size=tiny_models.SHARD_SIZE)
    tokenizer.save_pretrained(path)
    return path


def _family(arch: str, root: Path) -> dict[str, Path]:
    base = tiny_models.build_model(arch)
    if arch == "gemma3mm":
        base = tiny_models.text_only(base)
    tiny_models.save(base.float(), root / "base")
    return {
        "base": root / "base",
        "deva": _expert(arch, root / "deva", DEVANAGARI, 300),
        "cyr": _expert(arch, root / "cyr", CYRILLIC, 400),
        "greek": _expert(arch, root / "greek", GREEK, 500),
    }


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict[str, Path]:
    return _family("llama", tmp_path_factory.mktemp("vocab-llama"))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> dict[str, Path]:
    # Gemma-3's text model (tied embeddings: one vocabulary tensor).
    return _family("gemma3mm", tmp_path_factory.mktemp("vocab-gemma"))


def mergekit_run(config: dict, out: Path) -> Path:
    """mergekit's merge of `config`, its models taken in the config's order (see above)."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    def ordered(self) -> list:
        scopes = [self, *(self.modules or {}).values()]
        refs = [m.model for scope in scopes for m in scope.models or ()]
        refs += [s.model for scope in scopes for sl in scope.slices or () for s in sl.sources]
        refs += [self.base_model] if self.base_model is not None else []
        return list(dict.fromkeys(refs))

    options = MergeOptions(copy_tokenizer=True, write_model_card=False, quiet=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MergeConfiguration, "referenced_models", ordered)
        run_merge(MergeConfiguration.model_validate(config), str(out), options)
    return out


def surgery_run(config: dict, folder: Path, **options) -> Path:
    path = folder.with_suffix(".yml")
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return api.merge(path, folder, quiet=True, **options)


def _vocab(folder: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder)).get_vocab()


def assert_same_as_mergekit(config: dict, tmp_path: Path, **options) -> Path:
    ours = surgery_run(config, tmp_path / "ours", **options)
    theirs = mergekit_run(config, tmp_path / "mergekit")
    assert _vocab(ours) == _vocab(theirs)
    mine, other = load_state(ours), load_state(theirs)
    assert set(mine) == set(other)
    ulps = {k: ulp_distance(mine[k], other[k]) for k in mine}
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v > 1}
    config_out = json.loads((ours / "config.json").read_text())
    assert (
        config_out["vocab_size"] == json.loads((theirs / "config.json").read_text())["vocab_size"]
    )
    return ours


def _models(family: dict, method: str) -> dict:
    # float32 arithmetic rounded once to bf16, as the other oracle tests do (mergekit rounds
    # each float32 operation: a result near 0 differs by many float32 ulps).
    config: dict = {"merge_method": method, "dtype": "float32", "out_dtype": "bfloat16"}
    # Weights that never cancel exactly (a sum near 0 has no ulp to agree within).
    names, params = ["deva", "cyr", "greek"], [{"weight": w} for w in (0.47, 0.31, 0.22)]
    if method == "ties":
        params = [{"weight": 0.61, "density": 0.5}, {"weight": 0.37, "density": 0.7}]
        params += [{"weight": 0.29, "density": 0.6}]
        config["base_model"] = str(family["base"])
    if method == "slerp":  # two models, the first the base
        names, params = ["deva", "cyr"], [{}, {}]
        config["base_model"] = str(family["deva"])
        config["parameters"] = {"t": 0.4}
    config["models"] = [
        {"model": str(family[n]), "parameters": p} for n, p in zip(names, params, strict=True)
    ]
    return config


SOURCES = ["union", "base", "model"]
METHODS = ["linear", "ties", "slerp"]


def first_fast(*axes: list) -> list:
    """Every combination of the axes; all but the first (the union linear merge, about a second)
    marked slow: the fast suite keeps one of each check."""
    combos = [()]
    for axis in axes:
        combos = [(*c, v) for c in combos for v in axis]
    params = [pytest.param(*c, marks=pytest.mark.slow) for c in combos]
    return [pytest.param(*combos[0]), *params[1:]]


@pytest.mark.parametrize(("source", "method"), first_fast(SOURCES, METHODS))
def test_tokenizer_source_matches_mergekit(llama, tmp_path, source, method):
    config = _models(llama, method)
    config["tokenizer_source"] = str(llama["cyr"]) if source == "model" else source
    assert_same_as_mergekit(config, tmp_path)


@pytest.mark.parametrize("source", first_fast(SOURCES))
def test_linear_in_mergekit_arithmetic_is_float32_exact(llama, tmp_path, source):
    # Computed as mergekit computes, op by op in float32: every float32 tensor within 1 ulp.
    config = _models(llama, "linear") | {"out_dtype": "float32"}
    config["tokenizer_source"] = str(llama["cyr"]) if source == "model" else source
    assert_same_as_mergekit(config, tmp_path, mergekit_arithmetic=True)


def _tokens_block(family: dict, config: dict) -> dict:
    """A `tokenizer:` block with every kind of `tokens:` entry, over the config's models."""
    first, second = config["models"][0]["model"], config["models"][1]["model"]
    common = tiny_models.make_tokenizer().convert_ids_to_tokens(60)
    return {
        "source": "union",
        "pad_to_multiple_of": 64,
        "tokens": {
            "shared_tok": {"source": second},
            "привет": {"source": {"kind": "zero"}},
            "नमस्ते": {"source": {"kind": "model_token", "model": second, "token": "мир"}},
            "brand_new_tok": {"source": {"kind": "model_token", "model": first, "token_id": 5}},
            common: {
                "source": {"kind": "model_token", "model": second, "token_id": 9},
                "force": True,
            },
            "दुनिया": {"source": first, "force": True},
        },
    }


@pytest.mark.parametrize("method", first_fast(METHODS))
def test_tokens_block_matches_mergekit(llama, tmp_path, method):
    config = _models(llama, method)
    config["tokenizer"] = _tokens_block(llama, config)
    ours = assert_same_as_mergekit(config, tmp_path)
    record = json.loads((ours / "surgery_recipe.json").read_text())["tokenizer"]
    assert record["rows"] % 64 == 0 and record["rows"] >= record["tokens"]


def _refused(config: dict, tmp_path: Path, *words: str) -> str:
    """`surgery merge` refuses `config` in one line, exit 2, and writes nothing."""
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    result = CliRunner().invoke(cli, ["merge", str(path), str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    message = result.output.strip().splitlines()
    assert len(message) == 1 and all(w in message[0] for w in words), result.output
    assert not (tmp_path / "out").exists()
    return message[0]


def test_tokens_source_must_be_a_model_of_the_config(llama, tmp_path):
    config = _models(llama, "linear")
    config["tokenizer"] = {"tokens": {"shared_tok": {"source": str(llama["base"])}}}
    _refused(config, tmp_path, "tokenizer.tokens['shared_tok']", "not a model of the config")


@pytest.mark.parametrize("experts", [("deva", "cyr"), ("deva", "greek")])
def test_vocabularies_that_differ_need_a_tokenizer_choice(llama, tmp_path, experts):
    # deva and cyr differ in tokens and rows; deva and greek have as many rows, other tokens.
    config = _models(llama, "linear")
    config["models"] = [m for m in config["models"] if Path(m["model"]).name in experts]
    _refused(config, tmp_path, "tokenizer_source", "differ")


def test_one_vocabulary_needs_no_choice_and_keeps_the_donors_files(llama, tmp_path):
    config = _models(llama, "linear")
    config["models"] = [{"model": str(llama["deva"])}, {"model": str(llama["deva"])}]
    config["models"][1]["parameters"] = config["models"][0]["parameters"] = {"weight": 1.0}
    out = surgery_run(config, tmp_path / "same")
    assert "tokenizer" not in json.loads((out / "surgery_recipe.json").read_text())
    same = (out / "tokenizer.json").read_bytes() == (llama["deva"] / "tokenizer.json").read_bytes()
    assert same


def test_both_tokenizer_keys_are_refused(llama, tmp_path):
    config = _models(llama, "linear") | {"tokenizer_source": "union", "tokenizer": {}}
    _refused(config, tmp_path, "tokenizer_source or tokenizer")


def test_chat_template_without_a_tokenizer_is_ignored_with_a_warning(llama, tmp_path, capsys):
    config = _models(llama, "linear")
    config["models"] = [{"model": str(llama["deva"]), "parameters": {"weight": 1.0}}]
    config["chat_template"] = "{{ messages }}"
    surgery_run(config, tmp_path / "out")
    assert "chat_template is ignored" in capsys.readouterr().err


@pytest.mark.parametrize(("block", "method"), first_fast([True, False], METHODS))
def test_gemma3_text_matches_mergekit(gemma, tmp_path, block, method):
    # Tied embeddings: one vocabulary tensor, the head reads it.
    config = _models(gemma, method)
    if block:
        config["tokenizer"] = _tokens_block(gemma, config)
    else:
        config["tokenizer_source"] = "union"
    assert_same_as_mergekit(config, tmp_path)


def test_union_model_loads_and_tokenizes_with_each_experts_tokens(llama, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = _models(llama, "linear") | {"tokenizer_source": "union"}
    out = surgery_run(config, tmp_path / "union")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    vocab = tokenizer.get_vocab()
    for expert, words in (("deva", DEVANAGARI[:3]), ("cyr", CYRILLIC[1:]), ("greek", GREEK)):
        ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        assert {vocab[w] for w in words} <= set(ids), (expert, ids)
        # Only this expert has these tokens: every model got its rows, so the normalized linear
        # blend is its rows (rounded once to bf16), and so are the logits' head rows.
        theirs = AutoModelForCausalLM.from_pretrained(str(llama[expert]), dtype=torch.float32)
        own = AutoTokenizer.from_pretrained(str(llama[expert])).convert_tokens_to_ids(words)
        for mine, source in (
            (model.get_input_embeddings().weight, theirs.get_input_embeddings().weight),
            (model.get_output_embeddings().weight, theirs.get_output_embeddings().weight),
        ):
            expected = source[own].to(torch.bfloat16).float()
            torch.testing.assert_close(mine[[vocab[w] for w in words]], expected, atol=0, rtol=8e-3)
        logits = model(torch.tensor([ids])).logits
        assert torch.isfinite(logits).all()


@pytest.mark.parametrize("source", first_fast(SOURCES))
def test_soup_tokenizer_source_matches_mergekit_linear(llama, tmp_path, source):
    # A soup is mergekit's linear merge of equal weights; `base` is the first expert, as
    # mergekit takes it without a base model.
    experts = [str(llama[n]) for n in ("deva", "cyr", "greek")]
    choice = experts[1] if source == "model" else source
    args = ["soup", *experts, str(tmp_path / "ours"), "--tokenizer-source", choice]
    result = CliRunner().invoke(cli, [*args, "--dtype", "bf16", "--quiet"])
    assert result.exit_code == 0, result.output
    config = {
        "merge_method": "linear",
        "dtype": "float32",
        "out_dtype": "bfloat16",
        "models": [{"model": e, "parameters": {"weight": 1.0}} for e in experts],
        "tokenizer_source": choice,
    }
    theirs = mergekit_run(config, tmp_path / "mergekit")
    assert _vocab(tmp_path / "ours") == _vocab(theirs)
    mine, other = load_state(tmp_path / "ours"), load_state(theirs)
    ulps = {k: ulp_distance(mine[k], other[k]) for k in mine}
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v > 1}


@pytest.mark.parametrize("experts", [("deva", "cyr"), ("deva", "greek")])
def test_soup_of_differing_vocabularies_names_the_option(llama, tmp_path, experts):
    args = ["soup", *(str(llama[n]) for n in experts), str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "--tokenizer-source" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "template", first_fast(["{% for m in messages %}{{ m.content }}{% endfor %}", "auto"])
)
def test_chat_template_is_set_on_the_built_tokenizer(llama, tmp_path, template):
    from transformers import AutoTokenizer

    config = _models(llama, "linear") | {"tokenizer_source": "base", "chat_template": template}
    ours = surgery_run(config, tmp_path / "ours")
    theirs = mergekit_run(config, tmp_path / "mergekit")
    mine = AutoTokenizer.from_pretrained(str(ours)).chat_template
    assert mine == AutoTokenizer.from_pretrained(str(theirs)).chat_template
    assert mine == (None if template == "auto" else template)  # the tiny experts have none


def test_base_tokens_past_its_rows_are_dropped_as_mergekit_does(llama, tmp_path):
    # The base's tokenizer names two tokens its embeddings have no rows for.
    tokenizer = tiny_models.make_tokenizer()
    tokenizer.add_tokens(["unused_a", "unused_b"])
    base = tiny_models.build_model("llama").float()
    base.save_pretrained(tmp_path / "short", max_shard_size=tiny_models.SHARD_SIZE)
    tokenizer.save_pretrained(tmp_path / "short")
    config = _models(llama, "ties") | {"base_model": str(tmp_path / "short")}
    config["tokenizer_source"] = "union"
    ours = assert_same_as_mergekit(config, tmp_path)
    assert "unused_a" not in _vocab(ours)


def test_slices_slerp_union_matches_mergekit(llama, tmp_path):
    # The classic SLERP config, by slices: embeddings from the first slice, head from the last.
    n = tiny_models.NUM_LAYERS
    sources = [{"model": str(llama[m]), "layer_range": [0, n]} for m in ("deva", "cyr")]
    config = {
        "merge_method": "slerp",
        "base_model": str(llama["deva"]),
        "dtype": "float32",
        "out_dtype": "bfloat16",
        "slices": [{"sources": sources}],
        "parameters": {"t": [{"filter": "mlp", "value": [0, 0.7, 1]}, {"value": 0.3}]},
        "tokenizer_source": "union",
    }
    assert_same_as_mergekit(config, tmp_path)


def test_recipe_and_card_count_where_added_rows_came_from(llama, tmp_path):
    config = _models(llama, "linear") | {"tokenizer_source": "union"}
    out = surgery_run(config, tmp_path / "union")
    record = json.loads((out / "surgery_recipe.json").read_text())["tokenizer"]
    base_tokens = len(tiny_models.make_tokenizer())
    # Each script's tokens come from their only model; shared_tok (deva and cyr, no base) is
    # their mean.
    assert record == {
        "source": "union",
        "tokens": base_tokens + 11,
        "rows": base_tokens + 11,
        "added_rows": {"mean": 1, "model1": 3, "model2": 3, "model3": 4},
    }
    card = (out / "README.md").read_text()
    assert "built from `union`" in card and "3 from model1, 3 from model2, 4 from model3" in card
    soup = CliRunner().invoke(
        cli,
        [
            "soup",
            str(llama["deva"]),
            str(llama["cyr"]),
            str(tmp_path / "soup"),
            "--tokenizer-source",
            "base",
            "--quiet",
        ],
    )
    assert soup.exit_code == 0, soup.output
    record = json.loads((tmp_path / "soup" / "surgery_recipe.json").read_text())["tokenizer"]
    # The first expert's tokenizer: cyr lacks deva's 3 tokens, which come from deva alone.
    assert record["source"] == "base" and record["added_rows"] == {"expert1": 3}
