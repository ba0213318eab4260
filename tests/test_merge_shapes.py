"""Merges of tensors with three or more dimensions (a Gemma-3 multimodal checkpoint's 4-D patch
embedding, a mixture of experts' fused 3-D expert weights) and of empty tensors, with mergekit
as the oracle (issue 24, items 1 and 7)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.engine.ops.merge.arrays import CHUNK_ELEMENTS
from surgery.engine.ops.merge.dare import Dare
from surgery.engine.ops.merge.spec import MergeConfigError
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, ulp_distance
from tests.test_merge import mergekit_run, models, surgery_run


def _hub_layout(path: Path) -> None:
    """Rewrite a saved Gemma-3 multimodal checkpoint as Hub checkpoints name it (and mergekit's
    architecture file expects): `vision_tower.vision_model.*`."""
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())

    def hub(name: str) -> str:
        if name.startswith("vision_tower.") and ".vision_model." not in f".{name}":
            return "vision_tower.vision_model." + name.removeprefix("vision_tower.")
        return name

    for shard in sorted(set(index["weight_map"].values())):
        state = load_file(path / shard)
        save_file({hub(k): v for k, v in state.items()}, path / shard, {"format": "pt"})
    index["weight_map"] = {hub(k): v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))


def _moe(seed: int) -> torch.nn.Module:
    """A tiny Qwen3-MoE, whose experts are fused 3-D tensors (`mlp.experts.gate_up_proj`)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    model = Qwen3MoeForCausalLM(config)
    return tiny_models.perturb(model, seed) if seed else model


def _save_fused(model: torch.nn.Module, path: Path) -> Path:
    """The in-memory (fused) state dict as one safetensors file, with the model's config."""
    path.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path / "model.safetensors", {"format": "pt"})
    model.config.architectures = [type(model).__name__]  # as save_pretrained records it
    model.config.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gemma3mm(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gemma3mm")
    family = {}
    # float32 models with float32 noise: bf16 deltas tie so often that which tied element a
    # magnitude threshold keeps would decide (tests/test_merge.py shows how they differ then).
    for name, seed in (("base", 0), ("e1", 201), ("e2", 202)):
        model = tiny_models.build_model("gemma3mm").float()
        path = tiny_models.save(tiny_models.perturb(model, seed) if seed else model, root / name)
        _hub_layout(path)
        family[name] = path
    return {"base": family["base"], "experts": [family["e1"], family["e2"]]}


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("moe")
    base = _save_fused(_moe(0), root / "base")
    return {"base": base, "experts": [_save_fused(_moe(s), root / f"e{s}") for s in (7, 8)]}


def _dare_masks(config: dict, seed: int = 0) -> dict[bytes, torch.Tensor]:
    """The keep-masks surgery's DARE draws, keyed by the float32 delta they apply to."""
    base = load_state(Path(config["base_model"]))
    masks = {}
    for position, entry in enumerate(config["models"]):
        density = entry["parameters"]["density"]
        for name, value in load_state(Path(entry["model"])).items():
            delta = (value.float() - base[name].float()).reshape(-1).numpy()
            dare = Dare(None, delta.size, False, density, (seed, name, position))
            chunks = range(0, delta.size, CHUNK_ELEMENTS)
            mask = [dare.mask(s, delta[s : s + CHUNK_ELEMENTS]) for s in chunks]
            masks[delta.tobytes()] = torch.from_numpy(np.concatenate(mask or [np.ones(0, bool)]))
    return masks


def _mergekit_with_masks(config: dict, out: Path, monkeypatch) -> dict[str, torch.Tensor]:
    """mergekit's merge, its Bernoulli draws replaced by surgery's masks (a random mask cannot
    be compared; everything after it, rescaling and sign election included, is mergekit's)."""
    import mergekit.sparsify as sparsify

    masks = _dare_masks(config)

    def bernoulli(tensor, density, rescale_norm=None):
        mask = masks[tensor.float().reshape(-1).numpy().tobytes()].reshape(tensor.shape)
        return sparsify.rescaled_masked_tensor(tensor, mask.to(tensor.dtype), rescale_norm)

    monkeypatch.setattr(sparsify, "bernoulli", bernoulli)
    return mergekit_run(config, out)


PARAMS = {
    "ties": [{"weight": 0.5, "density": 0.4}, {"weight": 0.8, "density": 0.7}],
    "breadcrumbs": [
        {"weight": 0.5, "density": 0.6, "gamma": 0.05},
        {"weight": 0.4, "density": 0.5},
    ],
    "dare_ties": [{"weight": 0.6, "density": 0.5}, {"weight": 0.3, "density": 0.7}],
    "dare_linear": [{"weight": 0.6, "density": 0.5}, {"weight": 0.3, "density": 0.7}],
}


@pytest.mark.parametrize("family", ["gemma3mm", "moe"])
@pytest.mark.parametrize("method", list(PARAMS))
def test_sparsified_merges_of_multidimensional_tensors_match_mergekit(
    request, tmp_path, monkeypatch, family, method
):
    paths = request.getfixturevalue(family)
    config = {"merge_method": method, "dtype": "float32", **models(paths, PARAMS[method])}
    ours = assert_valid_output(surgery_run(config, tmp_path))
    if method.startswith("dare"):
        theirs = _mergekit_with_masks(config, tmp_path / "mergekit", monkeypatch)
    else:
        theirs = mergekit_run(config, tmp_path / "mergekit")
    # The tensors of 3 or more dimensions are there (mergekit leaves out a few tensors its
    # architecture file does not list, such as the vision head; surgery merges them too).
    assert any(v.dim() >= 3 for v in theirs.values())
    assert set(theirs) <= set(ours)
    if method.startswith("dare"):
        # The L1 rescaling factor is a ratio of float32 sums that mergekit and surgery add in
        # different orders (an ulp or so apart): a result near zero is then many of its own
        # ulps off, but never more than a few ulps of the deltas (about 0.05 here).
        for name, value in theirs.items():
            torch.testing.assert_close(
                ours[name], value, rtol=2**-20, atol=2**-24, msg=lambda m, n=name: f"{n}: {m}"
            )
        return
    ulps = {k: ulp_distance(ours[k], v) for k, v in theirs.items()}
    assert max(ulps.values()) <= 1, {k: u for k, u in ulps.items() if u > 1}


def test_della_refuses_tensors_of_three_dimensions(moe, tmp_path):
    # DELLA ranks within rows; mergekit ranks a 3-D tensor along its second dimension instead.
    params = [{"weight": 0.5, "density": 0.5}, {"weight": 0.5, "density": 0.5}]
    config = {"merge_method": "della", **models(moe, params)}
    with pytest.raises(MergeConfigError, match="DELLA ranks rows of 1-D or 2-D tensors"):
        surgery_run(config, tmp_path)
    assert not (tmp_path / "ours").exists()
