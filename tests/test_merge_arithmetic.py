"""`surgery merge --mergekit-arithmetic`: mergekit's own operations in the config's dtype, bit
for bit equal to mergekit's output (run in process, as in test_merge.py), on bf16 and fp16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from cli import cli
from surgery import api
from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, same_bits
from tests.test_merge import mergekit_run, models


@pytest.fixture(scope="module")
def llama(families) -> dict:
    return families("llama")  # bf16


def run(config: dict, tmp_path: Path, name: str, flag: bool) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(config))
    return api.merge(path, tmp_path / name, quiet=True, mergekit_arithmetic=flag)


def differing(ours: dict, theirs: dict) -> int:
    """Elements (over every tensor) whose bits differ."""
    assert set(ours) == set(theirs)
    return sum(int((ours[k].view(torch.int16) != theirs[k].view(torch.int16)).sum()) for k in ours)


# (method, per-model parameters, global parameters, needs a base, dtype keys, whether the
# default float32 arithmetic differs from mergekit's there).
CASES = [
    ("linear", [{"weight": 1.0}, {"weight": 0.3}, {"weight": 0.55}], {}, False, {}, True),
    # Without normalization the float32 sum rounded once is mergekit's addcmul_ already.
    ("linear", [{"weight": 1.0}, {"weight": [0.2, 0.9]}], {"normalize": False}, False, {}, False),
    ("task_arithmetic", [{"weight": 0.5}, {"weight": 0.3}, {"weight": 0.7}], {}, True, {}, True),
    ("ties", [{"weight": 0.5}, {"weight": 0.8}], {"lambda": 0.9}, True, {}, True),
    (
        "ties",
        [{"weight": 0.5}, {"weight": 0.8}, {"weight": 0.3}],
        {"int8_mask": True, "normalize": False},
        True,
        {"dtype": "float16"},
        True,
    ),
    ("dare_ties", [{"weight": 0.5, "density": 1.0}, {"weight": 0.8}], {}, True, {}, True),
    ("dare_linear", [{"weight": 0.6}, {"weight": [0.2, 0.7]}], {"lambda": 1.3}, True, {}, True),
    ("breadcrumbs_ties", [{"weight": 0.6}, {"weight": 0.7}], {}, True, {}, True),
    ("breadcrumbs", [{"weight": 0.6}, {"weight": 0.7}], {}, True, {}, True),
    ("della", [{"weight": 0.6, "density": 1.0}, {"weight": 0.7}], {}, True, {}, True),
    ("della_linear", [{"weight": 0.6}, {"weight": 0.7}], {"lambda": 0.8}, True, {}, True),
    # Computed in bf16, saved as float16 and float32 (mergekit's `.to(out_dtype)` at the end).
    ("ties", [{"weight": 0.4}, {"weight": 0.9}], {}, True, {"out_dtype": "float16"}, True),
    ("dare_ties", [{"weight": 0.4}, {"weight": 0.9}], {}, True, {"out_dtype": "float32"}, True),
    # No dtype: mergekit computes in the inputs' own bf16, as does the mode.
    ("task_arithmetic", [{"weight": 0.5}, {"weight": 0.3}], {}, True, {"dtype": None}, True),
]


@pytest.mark.parametrize(("method", "per_model", "shared", "base", "dtypes", "differs"), CASES)
def test_mergekit_arithmetic_is_bit_identical_to_mergekit(
    llama, tmp_path, method, per_model, shared, base, dtypes, differs
):
    config = {"merge_method": method, "dtype": "bfloat16", **models(llama, per_model, base)}
    config.update(dtypes)
    config = {key: value for key, value in config.items() if value is not None}
    if shared:
        config["parameters"] = shared
    theirs = mergekit_run(config, tmp_path / "mergekit")
    ours = assert_valid_output(run(config, tmp_path, "ours", flag=True))
    assert set(ours) == set(theirs)
    assert all(same_bits(ours[k], theirs[k]) for k in theirs)
    # The flag is what makes them equal: float32 arithmetic with one rounding differs.
    default = load_state(run(config, tmp_path, "default", flag=False))
    assert (differing(default, theirs) > 0) == differs


def test_mergekit_arithmetic_in_float32_is_the_default_arithmetic(llama, tmp_path):
    # With `dtype: float32` mergekit's arithmetic is the default's (float32, one rounding).
    config = {"merge_method": "ties", "dtype": "float32", "out_dtype": "bfloat16"}
    config.update(models(llama, [{"weight": 0.5}, {"weight": 0.8}]))
    theirs = mergekit_run(config, tmp_path / "mergekit")
    for flag in (True, False):
        ours = load_state(run(config, tmp_path, f"ours{flag}", flag))
        assert all(same_bits(ours[k], theirs[k]) for k in theirs)


def _perturbed_copy(source: Path, target: Path, seed: int) -> Path:
    """A copy of checkpoint `source` with seeded noise on every float tensor."""
    shutil.copytree(source, target)
    gen = torch.Generator().manual_seed(seed)
    for shard in sorted(target.glob("*.safetensors")):
        tensors = load_file(shard)
        for name, tensor in tensors.items():
            noise = 0.02 * torch.randn(tensor.shape, generator=gen)
            tensors[name] = (tensor.float() + noise).to(tensor.dtype)
        save_file(tensors, shard, metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory) -> list[Path]:
    """A bf16 Llama whose MLP weights have 1040 x 520 elements (4 chunks and a partial one),
    and two perturbed copies."""
    root = tmp_path_factory.mktemp("wide")
    base = tiny_models.random_llama(root / "base", hidden=520, layers=1, heads=4, kv_heads=2)
    return [base, *(_perturbed_copy(base, root / f"m{i}", i) for i in range(2))]


@pytest.mark.parametrize("method", ["linear", "ties"])
def test_chunks_change_no_bit(wide_llama, tmp_path, method):
    # Tensors of several chunks and a partial last one: bit-identical to mergekit's whole
    # tensors, so the chunked torch operations are the whole tensor's.
    name = "model.layers.0.mlp.up_proj.weight"
    assert load_state(wide_llama[0])[name].numel() > 4 * CHUNK_ELEMENTS
    config = {"merge_method": method, "dtype": "bfloat16", "base_model": str(wide_llama[0])}
    weights = (1.0, 0.3, 0.55)
    config["models"] = [
        {"model": str(p), "parameters": {"weight": w}}
        for p, w in zip(wide_llama, weights, strict=True)
    ]
    theirs = mergekit_run(config, tmp_path / "mergekit")
    ours = load_state(run(config, tmp_path, "ours", flag=True))
    assert set(ours) == set(theirs)
    assert all(same_bits(ours[k], theirs[k]) for k in theirs)
    default = load_state(run(config, tmp_path, "default", flag=False))
    assert not same_bits(default[name], theirs[name])


def test_the_recipe_and_card_record_the_mode_and_the_config_is_unchanged(llama, tmp_path):
    config = {"merge_method": "ties", "dtype": "bfloat16"}
    config.update(models(llama, [{"weight": 0.5}, {"weight": 0.8}]))
    on, off = (run(config, tmp_path, f"out{flag}", flag) for flag in (True, False))
    assert json.loads((on / "surgery_recipe.json").read_text())["mergekit_arithmetic"] is True
    assert "mergekit_arithmetic" not in json.loads((off / "surgery_recipe.json").read_text())
    assert "--mergekit-arithmetic" in (on / "README.md").read_text()
    assert "--mergekit-arithmetic" not in (off / "README.md").read_text()
    on_config = (on / "mergekit_config.yml").read_text()
    assert on_config == (off / "mergekit_config.yml").read_text()
    assert "arithmetic" not in on_config


@pytest.mark.parametrize(
    ("method", "per_model", "message"),
    [
        ("slerp", [{}], "--mergekit-arithmetic does not reproduce slerp"),
        ("dare_ties", [{"weight": 0.5, "density": 0.5}], "dare_ties at density 0.5"),
        ("ties", [{"weight": 0.5, "density": [1.0, 0.7]}], "ties at density 0."),
    ],
)
def test_what_the_mode_does_not_reproduce_is_refused(llama, tmp_path, method, per_model, message):
    config = {"merge_method": method, "dtype": "bfloat16", **models(llama, per_model)}
    if method == "slerp":
        config["parameters"] = {"t": 0.5}
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["merge", "--mergekit-arithmetic", str(path), str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()
    # Without the flag the same config merges.
    assert CliRunner().invoke(cli, ["merge", "-q", str(path), str(out)]).exit_code == 0


def test_a_slices_config_is_bit_identical_to_mergekit(llama, tmp_path):
    # Slices choose the tensors (as without the flag); the arithmetic of each is mergekit's.
    base, experts = str(llama["base"]), [str(e) for e in llama["experts"]]
    sources = [{"model": base, "layer_range": [1, 3]}] + [
        {"model": e, "layer_range": [1, 3], "parameters": {"weight": w}}
        for e, w in zip(experts, (0.6, [0.2, 0.9]), strict=False)
    ]
    config = {"merge_method": "ties", "dtype": "bfloat16", "base_model": base}
    config["slices"] = [{"sources": sources}]
    theirs = mergekit_run(config, tmp_path / "mergekit")
    ours = load_state(run(config, tmp_path, "ours", flag=True))
    assert set(ours) == set(theirs)
    assert all(same_bits(ours[k], theirs[k]) for k in theirs)
