"""`surgery merge`: mergekit's methods on the streaming engine, with mergekit as the oracle.

mergekit runs in process (`run_merge`, what `mergekit-yaml` calls) on the same YAML and the same
tiny checkpoints; deterministic methods must agree within 1 ulp of the output dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from cli import cli
from surgery import api
from surgery.engine.ops.merge import select
from surgery.engine.ops.merge.select import RankRange, magnitude_keys
from surgery.engine.ops.merge.spec import MergeConfigError
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, same_bits, ulp_distance


@pytest.fixture(scope="module")
def llama(families) -> dict:
    return families("llama")


@pytest.fixture(scope="module")
def gpt2(families) -> dict:
    return families("gpt2")


def mergekit_run(config: dict, out: Path) -> dict[str, torch.Tensor]:
    """mergekit's own merge of `config` (offline, local paths), loaded back."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    options = MergeOptions(copy_tokenizer=False, write_model_card=False, quiet=True)
    run_merge(MergeConfiguration.model_validate(config), str(out), options)
    return load_state(out)


def surgery_run(config: dict, tmp_path: Path, name: str = "ours", seed: int = 0) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(config))
    return api.merge(path, tmp_path / name, seed=seed, quiet=True)


def max_ulps(ours: dict, theirs: dict) -> dict[str, int]:
    assert set(ours) == set(theirs)
    return {k: ulp_distance(ours[k], theirs[k]) for k in ours if ours[k].is_floating_point()}


def models(family: dict, params: list[dict], base: bool = True) -> dict:
    experts = family["experts"]
    pairs = zip(experts, params, strict=False)
    config = {"models": [{"model": str(e), "parameters": p} for e, p in pairs]}
    if base:
        config["base_model"] = str(family["base"])
    return config


# Deterministic methods: (method, per-model parameters, global parameters, needs a base).
DETERMINISTIC = [
    ("linear", [{"weight": 1.0}, {"weight": [0.2, 0.9]}, {"weight": 0.5}], {}, False),
    ("task_arithmetic", [{"weight": 0.5}, {"weight": 0.3}, {"weight": [0.1, 0.7]}], {}, True),
    (
        "ties",
        [{"weight": 0.5, "density": 0.4}, {"weight": 0.8, "density": [0.3, 0.7]}],
        {"lambda": 0.9},
        True,
    ),
    (
        "breadcrumbs",
        [{"weight": 0.5, "density": 0.6, "gamma": 0.05}, {"weight": 0.4, "density": 0.5}],
        {},
        True,
    ),
    (
        "breadcrumbs_ties",
        [{"weight": 0.5, "density": 0.7}, {"weight": 0.4, "density": 0.5, "gamma": 0.1}],
        {"normalize": True, "int8_mask": True},
        True,
    ),
    ("nuslerp", [{"weight": 0.3}, {"weight": 0.7}], {}, True),
    ("nuslerp", [{"weight": 0.6}, {"weight": 0.2}], {}, False),
    ("model_stock", [{}, {}, {}], {}, True),
]


@pytest.mark.parametrize(("method", "params", "shared", "base"), DETERMINISTIC)
def test_deterministic_methods_match_mergekit(llama, gpt2, tmp_path, method, params, shared, base):
    # bf16 inputs computed in float32 by both (mergekit computes in `dtype`) and rounded once to
    # bf16. Magnitude thresholds use gpt2's float32 weights: bf16 deltas tie so often that
    # which tied element is kept decides (see the next test).
    config = {"merge_method": method, "dtype": "float32", "out_dtype": "bfloat16"}
    if method in ("ties", "breadcrumbs", "breadcrumbs_ties"):
        config = {"merge_method": method, **models(gpt2, params, base)}
    else:
        config |= models(llama, params, base)
    if shared:
        config["parameters"] = shared
    ours = assert_valid_output(surgery_run(config, tmp_path))
    ulps = max_ulps(ours, mergekit_run(config, tmp_path / "mergekit"))
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v > 1}


# The three ways a threshold is selected (select.py), each forced on every tensor:
# (WHOLE_BYTES, SAMPLE_SIZE, the function that must run).
SELECTION_WAYS = {
    "in memory": (2**40, 2**16, "_in_memory"),  # (its windows are in memory)
    "window": (0, 64, "_in_window"),
    "radix": (0, 2**40, "_radix"),
}


def force_selection(monkeypatch, way: str) -> list[str]:
    """Make every selection take `way` (but radix selection for a tensor too small to sample,
    or where a window misses); returns the list of ways that ran (by function name)."""
    whole, sample, _ = SELECTION_WAYS[way]
    monkeypatch.setattr(select, "WHOLE_BYTES", whole)
    monkeypatch.setattr(select, "SAMPLE_SIZE", sample)
    ran: list[str] = []
    for name in ("_in_memory", "_in_window", "_radix"):
        original = getattr(select, name)
        monkeypatch.setattr(select, name, _recording(original, name, ran))
    return ran


# What each way may call: a window within an in-memory selection, radix selection for a tensor
# too small to sample or where a window misses.
_INNER = {"_in_memory": {"_in_window"}, "_in_window": {"_radix"}, "_radix": set()}


def _recording(function, name: str, ran: list[str]):
    def recorded(*args):
        ran.append(name)
        return function(*args)

    return recorded


@pytest.mark.parametrize(
    ("method", "params", "shared", "base"),
    [case for case in DETERMINISTIC if case[0] in ("ties", "breadcrumbs", "breadcrumbs_ties")],
)
def test_selection_in_memory_in_window_and_by_radix_writes_the_same_bytes(
    gpt2, tmp_path, monkeypatch, method, params, shared, base
):
    # The same config three ways: the same bytes, each within 1 ulp of mergekit (float32 gpt2).
    config = {"merge_method": method, **models(gpt2, params, base), "parameters": shared}
    theirs = mergekit_run(config, tmp_path / "mergekit")
    states = {}
    for way, (_, _, function) in SELECTION_WAYS.items():
        with monkeypatch.context() as patch:
            ran = force_selection(patch, way)
            states[way] = assert_valid_output(surgery_run(config, tmp_path, way.replace(" ", "_")))
        assert function in ran and set(ran) <= {function, *_INNER[function]}, (way, set(ran))
        ulps = max_ulps(states[way], theirs)
        assert max(ulps.values()) <= 1, (way, {k: v for k, v in ulps.items() if v > 1})
    first = states["in memory"]
    for way, state in states.items():
        assert all(same_bits(state[k], first[k]) for k in first), way


def test_slerp_slices_with_filtered_gradients_match_mergekit(llama, tmp_path):
    # The classic SLERP config: slices over the whole stack, t per filter with layer gradients;
    # bf16 inputs computed in float32 by both and rounded once to bf16.
    n = tiny_models.NUM_LAYERS
    config = {
        "merge_method": "slerp",
        "base_model": str(llama["base"]),
        "dtype": "float32",
        "out_dtype": "bfloat16",
        "slices": [
            {
                "sources": [
                    {"model": str(llama["base"]), "layer_range": [0, n]},
                    {"model": str(llama["trained"]), "layer_range": [0, n]},
                ]
            }
        ],
        "parameters": {
            "t": [
                {"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
                {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]},
                {"value": 0.5},
            ]
        },
    }
    ours = assert_valid_output(surgery_run(config, tmp_path))
    ulps = max_ulps(ours, mergekit_run(config, tmp_path / "mergekit"))
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v > 1}


def test_ties_on_bf16_differs_from_mergekit_only_at_tied_thresholds(llama, tmp_path):
    # bf16 deltas tie often; which tied element is kept at the threshold is arbitrary in mergekit
    # (an unstable argsort) and by position here. Everywhere else the outputs agree.
    params = [{"weight": 0.5, "density": 0.4}, {"weight": 0.8, "density": 0.6}]
    config = {"merge_method": "ties", "dtype": "float32", "out_dtype": "bfloat16"}
    config |= models(llama, params)
    ours = surgery_run(config, tmp_path)
    theirs = mergekit_run(config, tmp_path / "mergekit")
    state, base = load_state(ours), load_state(llama["base"])
    experts = [load_state(e) for e in llama["experts"][:2]]
    for name, value in state.items():
        ulp = ulp_distance(value, theirs[name])
        if ulp <= 1:
            continue
        tied = torch.zeros(value.shape, dtype=torch.bool)
        for expert, p in zip(experts, params, strict=True):
            delta = (expert[name].float() - base[name].float()).abs().reshape(-1)
            k = max(1, int(p["density"] * delta.numel()))
            threshold = delta.sort(descending=True).values[k - 1]
            tied |= (delta == threshold).reshape(value.shape)
        differs = value.float() != theirs[name].float()
        assert not (differs & ~tied).any(), name


@pytest.mark.parametrize("method", ["dare_ties", "dare_linear", "della", "della_linear"])
def test_random_methods_at_density_one_equal_mergekit(gpt2, tmp_path, method):
    params = [{"weight": 0.6, "density": 1.0}, {"weight": 0.3, "density": 1.0}]
    config = {"merge_method": method, "dtype": "float32", **models(gpt2, params)}
    ours = assert_valid_output(surgery_run(config, tmp_path))
    ulps = max_ulps(ours, mergekit_run(config, tmp_path / "mergekit"))
    assert max(ulps.values()) <= 1


def _delta_statistics(out: Path, family: dict, expert: int) -> tuple[float, float]:
    """Kept fraction and mean |kept / original| of one expert's task vector in a dare_linear
    or della_linear merge of that expert alone (weight 1, no normalization)."""
    merged, base = load_state(out), load_state(family["base"])
    original = load_state(family["experts"][expert])
    kept = total = 0
    ratios = []
    for name, value in merged.items():
        if value.numel() < 1000:
            continue
        delta = original[name].double() - base[name].double()
        result = value.double() - base[name].double()
        nonzero = result != 0
        kept += int(nonzero.sum())
        total += value.numel()
        ratios.append(float((result[nonzero] / delta[nonzero]).median()))
    return kept / total, float(np.median(ratios))


@pytest.mark.parametrize(("method", "extra"), [("dare_linear", {}), ("della_linear", {})])
def test_random_methods_keep_density_and_rescale(gpt2, tmp_path, method, extra):
    config = {
        "merge_method": method,
        "base_model": str(gpt2["base"]),
        "dtype": "float32",
        "models": [{"model": str(gpt2["experts"][0]), "parameters": {"weight": 1.0}}],
        "parameters": {"density": 0.3, **extra},
    }
    out = surgery_run(config, tmp_path)
    fraction, ratio = _delta_statistics(out, gpt2, 0)
    assert abs(fraction - 0.3) < 0.01
    # L1 rescaling divides by the kept share of the L1 norm: about 1 / density for DARE; for
    # DELLA, which keeps large magnitudes more often, by less.
    if method == "dare_linear":
        assert abs(ratio - 1 / 0.3) < 0.2
    else:
        assert 1.0 < ratio < 1 / 0.3
    # Same seed: same bytes; another seed: other masks.
    again = surgery_run(config, tmp_path, name="again")
    other = surgery_run(config, tmp_path, name="other", seed=1)
    first, second, third = load_state(out), load_state(again), load_state(other)
    assert all(same_bits(first[k], second[k]) for k in first)
    assert not all(same_bits(first[k], third[k]) for k in first)
    assert json.loads((out / "surgery_recipe.json").read_text())["seed"] == 0


@pytest.mark.parametrize(
    "way", ["in memory", "in memory, window missed", "window", "window missed", "radix"]
)
def test_selection_finds_exact_ranks_with_ties_every_way(way, monkeypatch):
    rng = np.random.default_rng(0)
    values = np.round(rng.normal(size=50_000), 2).astype(np.float32)  # many ties
    chunks = [values[i : i + 4096] for i in range(0, values.size, 4096)]
    keys = lambda first: (  # noqa: E731
        (i * 4096, magnitude_keys(c)) for i, c in enumerate(chunks) if i * 4096 >= first
    )
    sample = None
    if way == "in memory, window missed":  # windows of one sampled key: a partition then
        monkeypatch.setattr(select, "SAMPLE_SIZE", 16)
        monkeypatch.setattr(select, "_WINDOW_SIGMAS", 0)
        monkeypatch.setattr(select, "_WINDOW_SLACK", 0)
    if not way.startswith("in memory"):
        monkeypatch.setattr(select, "WHOLE_BYTES", 0)
        monkeypatch.setattr(select, "_radix", _counting(select._radix, way))
    if way == "window":
        sample = magnitude_keys(values[3::7])
    if way == "window missed":  # a sample of the smallest magnitudes only: radix selection then
        sample = np.sort(magnitude_keys(values))[:5000]
    order = np.argsort(np.abs(values), kind="stable")
    cases = [(0, 1), (100, 20_000), (49_000, 50_000), (7, 7), (12_345, 12_346), (0, 50_000)]
    for lo, hi in [*cases, (30_000, 50_000), (1, 49_999)]:
        keep = RankRange(keys, 32, lo, hi, values.size, sample)
        mask = np.concatenate(
            [keep.mask(magnitude_keys(c), i * 4096) for i, c in enumerate(chunks)]
        )
        expected = np.zeros(values.size, bool)
        expected[order[lo:hi]] = True
        assert np.array_equal(mask, expected), (lo, hi)
        # Any chunk masks on its own: segments of a tensor give the same mask in any order.
        for i in (5, 0, 11):
            got = keep.mask(magnitude_keys(chunks[i]), i * 4096)
            assert np.array_equal(got, expected[i * 4096 : i * 4096 + len(chunks[i])])


def _counting(radix, way: str):
    """`_radix`, refusing to run where a window should have found every rank."""

    def counted(*args):
        assert way != "window", "the window missed a rank"
        return radix(*args)

    return counted


def test_passthrough_slices_renumber_layers_and_update_config(llama, tmp_path):
    config = {
        "merge_method": "passthrough",
        "slices": [
            {"sources": [{"model": str(llama["base"]), "layer_range": [0, 3]}]},
            {"sources": [{"model": str(llama["trained"]), "layer_range": [1, 4]}]},
        ],
    }
    out = surgery_run(config, tmp_path)
    ours = assert_valid_output(out)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 6
    base, trained = load_state(llama["base"]), load_state(llama["trained"])
    assert same_bits(
        ours["model.layers.4.mlp.up_proj.weight"], trained["model.layers.2.mlp.up_proj.weight"]
    )
    assert same_bits(ours["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert same_bits(ours["lm_head.weight"], trained["lm_head.weight"])
    theirs = mergekit_run(config, tmp_path / "mergekit")
    assert set(ours) == set(theirs)
    assert all(same_bits(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("task_arithmetic", {"weight": 0.5}),
        ("ties", {"weight": 0.5, "density": 0.5}),
        ("dare_linear", {"weight": 0.5, "density": 0.5}),
        ("breadcrumbs_ties", {"weight": 0.5, "density": 0.5}),
        ("della", {"weight": 0.5, "density": 0.5, "epsilon": 0.1}),
    ],
)
def test_a_slice_whose_only_source_is_the_base_is_the_base(llama, tmp_path, method, params):
    # Nothing to add to the base: mergekit returns it (cast to out_dtype), not an error.
    base, trained = str(llama["base"]), str(llama["trained"])
    config = {
        "merge_method": method,
        "base_model": base,
        "out_dtype": "float32",
        "parameters": params,
        "slices": [
            {"sources": [{"model": s, "layer_range": [0, 2]} for s in (base, trained)]},
            {"sources": [{"model": base, "layer_range": [2, 4]}]},
        ],
    }
    ours = assert_valid_output(surgery_run(config, tmp_path))
    expected = load_state(llama["base"])["model.layers.3.mlp.up_proj.weight"].float()
    assert same_bits(ours["model.layers.3.mlp.up_proj.weight"], expected)
    theirs = mergekit_run(config, tmp_path / "mergekit")
    assert set(ours) == set(theirs)
    names = [k for k in ours if k.startswith(("model.layers.2.", "model.layers.3."))]
    assert names and all(same_bits(ours[k], theirs[k]) for k in names)


@pytest.fixture(scope="module")
def gpt_neox(tmp_path_factory) -> dict:
    family = tiny_models.build_family("gpt_neox", tmp_path_factory.mktemp("gpt_neox"), experts=0)
    for name in ("base", "trained"):
        tiny_models.add_gpt_neox_buffers(family[name])
    return family


def test_sliced_merges_take_pre_weights_from_the_first_slice_and_post_from_the_last(
    gpt_neox, tmp_path
):
    # GPT-NeoX's head is `embed_out.weight`: a "post" weight, from the last slice, although its
    # name says "embed"; its embedding `gpt_neox.embed_in.weight` comes from the first.
    config = {
        "merge_method": "passthrough",
        "slices": [
            {"sources": [{"model": str(gpt_neox["base"]), "layer_range": [0, 2]}]},
            {"sources": [{"model": str(gpt_neox["trained"]), "layer_range": [2, 4]}]},
        ],
    }
    ours = assert_valid_output(surgery_run(config, tmp_path))
    trained = load_state(gpt_neox["trained"])
    assert same_bits(ours["embed_out.weight"], trained["embed_out.weight"])
    theirs = mergekit_run(config, tmp_path / "mergekit")
    assert set(ours) == set(theirs)
    assert all(same_bits(ours[k], theirs[k]) for k in ours)


def test_pre_and_post_weight_tables_are_mergekits():
    # The tables are derived from mergekit's architecture files; hold them equal to the
    # installed mergekit's.
    from importlib import resources

    from surgery.engine.ops.merge import architectures

    pre, post = set(), set()
    for entry in resources.files("mergekit._data.architectures").iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            pre |= {w["name"] for w in data.get("pre_weights", [])}
            post |= {w["name"] for w in data.get("post_weights", [])}
    assert (pre, post) == (architectures.PRE_WEIGHTS, architectures.POST_WEIGHTS)
    assert not architectures.is_pre_weight("embed_out.weight")
    assert architectures.is_pre_weight("gpt_neox.embed_in.weight")


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        (["revert", "--layers", "0:2"], "pair"),
        (["interpolate", "--alpha", "1:3=0.3,*=0.8"], "pair"),
        (["soup", "--weights", "2,1,1"], "experts"),
    ],
)
def test_outputs_carry_a_mergekit_config_that_reproduces_them(llama, tmp_path, command, needs):
    inputs = (
        [str(llama["base"]), str(llama["trained"])]
        if needs == "pair"
        else [str(e) for e in llama["experts"]]
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [*command, *inputs, str(out), "-q"])
    assert result.exit_code == 0, result.output
    config_path = out / "mergekit_config.yml"
    config = yaml.safe_load(config_path.read_text())
    original = load_state(out)
    replay = load_state(api.merge(config_path, tmp_path / "replay", quiet=True))
    assert set(replay) == set(original)
    assert all(same_bits(original[k], replay[k]) for k in original)
    theirs = mergekit_run(config, tmp_path / "mergekit")
    ulps = max_ulps(original, theirs)
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("merge_method: nonesuch\nmodels: [{model: a}]\n", "'nonesuch' is not supported"),
        ("merge_method: linear\nmodels: [{model: a}]\nchat_template: [x]\n", "chat_template"),
        ("merge_method: linear\nmodels: [{model: a}]\nfoo: 1\n", "key 'foo'"),
        ("merge_method: linear\nmodels: [{model: a, weight: 1}]\n", "models[0]: key 'weight'"),
        (
            "merge_method: linear\nmodels: [{model: a}]\ntokenizer_source: union\ntokenizer: {}\n",
            "tokenizer_source or tokenizer",
        ),
        ("merge_method: linear\n", "invalid mergekit config"),
        ("- 1\n", "mapping"),
    ],
)
def test_unsupported_configs_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "c.yml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["merge", str(path), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unknown_parameters_and_broken_contracts_are_errors(llama, tmp_path):
    bad_param = {"merge_method": "ties", **models(llama, [{"weight": 1, "densty": 0.5}])}
    with pytest.raises(MergeConfigError, match="parameter 'densty'"):
        surgery_run(bad_param, tmp_path, "a")
    no_base = {"merge_method": "ties", **models(llama, [{"weight": 1}], base=False)}
    with pytest.raises(MergeConfigError, match="needs a base_model"):
        surgery_run(no_base, tmp_path, "b")
    della = {"merge_method": "della", **models(llama, [{"weight": 1, "density": 0.9}])}
    with pytest.raises(MergeConfigError, match="epsilon"):
        surgery_run(della, tmp_path, "c")


def test_della_row_order_is_the_stable_argsort():
    from surgery.engine.ops.merge.della import _stable_order

    rng = np.random.default_rng(0)
    for shape in [(3, 1), (5, 7), (16, 2048), (2, 1000)]:
        rows = np.abs(np.round(rng.normal(size=shape), 1)).astype(np.float32)  # many ties
        rows[0, -1] = np.nan
        for values in (rows, rows.astype(np.float64)):
            expected = np.argsort(values, axis=1, kind="stable")
            assert np.array_equal(_stable_order(values), expected), shape
