"""mergekit's other seven methods (sce, karcher, multislerp, nearswap, arcee_fusion, ram,
ramplus_tl) on the streaming engine, with mergekit as the oracle, as in test_merge.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS
from surgery.engine.ops.merge.spec import MergeConfigError
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, same_bits
from tests.test_merge import (
    _INNER,
    SELECTION_WAYS,
    force_selection,
    max_ulps,
    mergekit_run,
    models,
    surgery_run,
)


@pytest.fixture(scope="module")
def llama(families) -> dict:
    return families("llama")


@pytest.fixture(scope="module")
def gpt2(families) -> dict:
    return families("gpt2")


# (method, per-model parameters, global parameters, needs a base).
DETERMINISTIC = [
    ("nearswap", [{}], {"t": 0.002}, True),
    ("nearswap", [{}], {"t": [0.0005, 0.01]}, True),
    ("nearswap", [{}], {"t": 5e-7}, True),  # t under the 1e-6 floor of |base - other|
    ("nearswap", [{}], {"t": -0.001}, True),  # mergekit clamps the weights to 0: the base
    ("ram", [{}, {}, {}], {"epsilon": 0.003}, True),
    ("ram", [{}, {}], {}, True),
    ("ramplus_tl", [{}, {}, {}], {"epsilon": 0.003, "r": 0.5, "alpha": 0.6}, True),
    ("ramplus_tl", [{}, {}], {"epsilon": 0.004}, True),
    ("multislerp", [{"weight": 0.5}, {"weight": 0.3}, {"weight": [0.1, 0.7]}], {}, True),
    ("multislerp", [{"weight": 1.0}, {"weight": 2.0}], {}, False),
    ("multislerp", [{"weight": 0.2}, {"weight": 0.5}], {"normalize_weights": False}, True),
    ("karcher", [{}, {}, {}], {}, False),
    ("karcher", [{}, {}], {"max_iter": 3, "tol": 1e-6}, False),
    ("sce", [{}, {}, {}], {"select_topk": 0.3}, True),
    ("sce", [{}, {}], {}, True),
    ("sce", [{}, {}, {}], {"select_topk": [0.1, 0.9], "int8_mask": True}, True),
]


@pytest.mark.parametrize(("method", "params", "shared", "base"), DETERMINISTIC)
def test_deterministic_methods_match_mergekit(llama, gpt2, tmp_path, method, params, shared, base):
    # bf16 inputs computed in float32 by both and rounded once to bf16, as in test_merge.py;
    # sce's variance threshold on gpt2's float32 weights, where variances do not tie.
    family = gpt2 if method == "sce" else llama
    config = {"merge_method": method, "dtype": "float32", "out_dtype": "bfloat16"}
    config |= models(family, params, base)
    if shared:
        config["parameters"] = shared
    ours = assert_valid_output(surgery_run(config, tmp_path))
    theirs = mergekit_run(config, tmp_path / "mergekit")
    inputs = [load_state(m["model"]) for m in config["models"]]
    if base:
        inputs.append(load_state(config["base_model"]))
    far = _beyond_rounding(ours, theirs, inputs)
    assert not far, far


def _beyond_rounding(ours: dict, theirs: dict, inputs: list[dict]) -> dict[str, int]:
    """Tensors with elements more than 1 ulp apart, unless the two differ by less than float32
    rounding of the inputs there: where the result nearly cancels (base + delta ~ 0), both
    tools' float32 arithmetic is only that exact, and bf16's ulps there are far finer."""
    far = {}
    for name, ulps in max_ulps(ours, theirs).items():
        if ulps <= 1:
            continue
        scale = torch.stack([m[name].float().abs() for m in inputs]).amax(dim=0)
        eps = torch.finfo(torch.float32).eps
        diff = (ours[name].double() - theirs[name].double()).abs()
        bad = (_ulps_each(ours[name], theirs[name]) > 1) & (diff > 8 * eps * scale.double())
        if bad.any():
            far[name] = ulps
    return far


def _ulps_each(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in ulps (as `checks.ulp_distance`, per element)."""
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ia, ib = a.contiguous().view(int_type).long(), b.contiguous().view(int_type).long()
    sign = 1 << (8 * a.element_size() - 1)
    ia = torch.where(ia < 0, -(ia + sign), ia)
    ib = torch.where(ib < 0, -(ib + sign), ib)
    return (ia - ib).abs()


# sce on bf16 experts: bf16 task vectors make many variances equal, so which of the elements tied
# at the `select_topk` threshold are kept is a choice; mergekit's `torch.topk` makes it
# arbitrarily, ours by position. The choice also sets each model's weight (the mean square of
# its selected task vector), so it moves every selected element of the tensor, not only the tied
# ones. Here, against mergekit as it is, 274 of 1,527,168 elements differ: 36 tied at the
# threshold, 238 away from it (220 by 1 ulp); given the same choice, 27 (1 ulp but one, where the
# result nearly cancels).


@pytest.fixture(scope="module")
def wide_bf16(tmp_path_factory) -> dict:
    """A bf16 Llama whose MLP weights span 2.25 chunks, and three bf16 experts of it."""
    root = tmp_path_factory.mktemp("wide_bf16")
    base = tiny_models.random_llama(root / "base", hidden=384, layers=1)
    experts = [_noisy_copy(base, root / f"expert{i}", seed=300 + i) for i in range(3)]
    return {"base": base, "experts": experts}


def _noisy_copy(source: Path, target: Path, seed: int, scale: float = 0.01) -> Path:
    """A copy of bf16 checkpoint `source` with seeded noise (half the weights' spread) on every
    tensor, rounded to bf16 (a stand-in for a fine-tune)."""
    shutil.copytree(source, target)
    gen = torch.Generator().manual_seed(seed)
    for shard in sorted(target.glob("*.safetensors")):
        tensors = load_file(shard)
        for name, tensor in tensors.items():
            noise = scale * torch.randn(tensor.shape, generator=gen)
            tensors[name] = (tensor.float() + noise).to(tensor.dtype)
        save_file(tensors, shard, metadata={"format": "pt"})
    return target


def _topk_ties_by_position(values: torch.Tensor, k: int, largest: bool = True, **_) -> tuple:
    """torch.topk (largest) whose ties at the k-th value keep the later positions, as our
    radix selection does: ascending by (value, position), the last k."""
    assert largest
    indices = torch.sort(values, stable=True).indices[values.numel() - k :]
    return values[indices], indices


@pytest.mark.parametrize("way", SELECTION_WAYS)
def test_sce_on_bf16_experts_matches_mergekit_given_the_same_ties(
    wide_bf16, tmp_path, monkeypatch, way
):
    # Every way of selecting the variance threshold (select.py): the same bytes as in memory.
    config = {"merge_method": "sce", "dtype": "float32", "out_dtype": "bfloat16"}
    config |= models(wide_bf16, [{}, {}, {}]) | {"parameters": {"select_topk": 0.5}}
    name = "model.layers.0.mlp.up_proj.weight"
    assert load_state(wide_bf16["base"])[name].numel() > 2 * CHUNK_ELEMENTS
    with monkeypatch.context() as patch:
        ran = force_selection(patch, way)
        ours = assert_valid_output(surgery_run(config, tmp_path))
    function = SELECTION_WAYS[way][2]
    assert function in ran and set(ran) <= {function, *_INNER[function]}
    if way != "in memory":
        reference = assert_valid_output(surgery_run(config, tmp_path, "in_memory"))
        assert all(same_bits(ours[k], reference[k]) for k in ours)
    inputs = [load_state(m["model"]) for m in config["models"]] + [load_state(wide_bf16["base"])]
    # As it is, mergekit keeps other tied elements: it differs beyond rounding (the case).
    assert _beyond_rounding(ours, mergekit_run(config, tmp_path / "mergekit"), inputs)
    # In an sce merge, mergekit calls topk only to select the variances (`sce_mask`).
    monkeypatch.setattr(torch, "topk", _topk_ties_by_position)
    theirs = mergekit_run(config, tmp_path / "mergekit_ties")
    far = _beyond_rounding(ours, theirs, inputs)
    assert not far, far


# arcee_fusion: a threshold from quantiles of float32 importances, sampled above 10^6.


def test_arcee_fusion_matches_mergekit_but_at_its_threshold(llama, tmp_path):
    # Importance is |delta| times a KL divergence of two nearly equal softmaxes: float32 gets it
    # to about 1e-4 relative in either tool (torch's and numpy's exp round differently), so an
    # element whose importance lies that near the threshold may be kept by one tool only.
    # Every other element agrees within 1 ulp, and the near ones are a small share.
    from mergekit.merge_methods.arcee_fusion import DynamicThresholdFusion, _compute_importance

    config = {"merge_method": "arcee_fusion", "dtype": "float32", "out_dtype": "bfloat16"}
    config |= models(llama, [{}], base=True)
    ours = assert_valid_output(surgery_run(config, tmp_path))
    theirs = mergekit_run(config, tmp_path / "mergekit")
    base, other = load_state(llama["base"]), load_state(llama["experts"][0])
    near = total = 0
    for name, value in ours.items():
        score = _compute_importance(other[name].float(), base[name].float())
        threshold = DynamicThresholdFusion().calculate_dynamic_threshold(score)
        close = (score - threshold).abs() <= 1e-3 * threshold.abs()
        apart = _ulps_each(value, theirs[name]) > 1
        assert not (apart & ~close).any(), name
        near, total = near + int(close.sum()), total + value.numel()
    assert near < 0.001 * total


def _single_tensor_model(path: Path, tensor: torch.Tensor) -> Path:
    path.mkdir(parents=True)
    tensors = {"model.layers.0.mlp.up_proj.weight": tensor.contiguous()}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def test_arcee_fusion_samples_its_threshold_above_a_million_elements(tmp_path):
    # Above 10^6 elements mergekit takes the quantiles from a random sample of 10^6 (with
    # replacement); so does this tool, reproducibly from (seed, tensor). Both keep the share of
    # elements the exact quantiles keep, within the sample's error (about 1e-3 here).
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(1024, 1100, generator=gen)
    other = base + 0.02 * torch.randn(1024, 1100, generator=gen)
    paths = [_single_tensor_model(tmp_path / n, t) for n, t in (("b", base), ("o", other))]
    config = {"merge_method": "arcee_fusion", "base_model": str(paths[0])}
    config["models"] = [{"model": str(p)} for p in paths]
    name = "model.layers.0.mlp.up_proj.weight"
    runs = [
        load_state(surgery_run(config, tmp_path, f"run{i}", seed))[name]
        for i, seed in enumerate((0, 0, 1))
    ]
    assert same_bits(runs[0], runs[1]) and not same_bits(runs[0], runs[2])

    from mergekit.merge_methods.arcee_fusion import DynamicThresholdFusion, _compute_importance

    score = _compute_importance(other, base)
    ordered = score.reshape(-1).sort().values
    q1, median, q3 = (ordered[int(q * (ordered.numel() - 1))] for q in (0.25, 0.5, 0.75))
    exact = float((score >= median + 1.5 * (q3 - q1)).float().mean())
    mergekit_mask, _ = DynamicThresholdFusion().compute_fusion_mask(score)
    ours = [float((run != base).float().mean()) for run in runs]
    assert 0.01 < exact < 0.2
    assert abs(float(mergekit_mask.mean()) - exact) < 2e-3
    assert all(abs(kept - exact) < 2e-3 for kept in ours), (ours, exact)


# Contracts and parameters: refused before anything is written.


@pytest.mark.parametrize(
    ("method", "params", "shared", "count", "message"),
    [
        ("nearswap", [{}, {}], {"t": 0.1}, 3, "takes at least 2 and at most 2 models; got 3"),
        ("nearswap", [{}], {}, 2, "missing parameter 't'"),
        ("arcee_fusion", [{}], {"t": 0.1}, 2, "parameter 't' is not one of arcee_fusion's"),
        ("multislerp", [], {}, 1, "takes at least 1 models besides the base; got 0"),
        ("sce", [{}], {"select_top": 0.5}, 2, "parameter 'select_top' is not one of sce's"),
        ("ramplus_tl", [{}], {"r": "x"}, 2, "r 'x'"),
    ],
)
def test_contracts_and_parameters_of_the_new_methods(
    llama, tmp_path, method, params, shared, count, message
):
    config = {"merge_method": method, "base_model": str(llama["base"]), "parameters": shared}
    inputs = [llama["base"], *llama["experts"]][:count]
    config["models"] = [{"model": str(m)} for m in inputs]
    for entry, p in zip(config["models"][1:], params, strict=False):
        entry["parameters"] = p
    with pytest.raises(MergeConfigError, match=re.escape(message)):
        surgery_run(config, tmp_path)
    assert not (tmp_path / "ours").exists()
