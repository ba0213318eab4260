"""FP8 checkpoints with block scales (DeepSeek-V3 / Qwen3-FP8 layout): a weight is its F8_E4M3
values times `weight_scale_inv`, one float32 scale per 128 x 128 block. Blends must be blends of
the weights, checked here against the float mean of the dequantized inputs."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.hostile.support import assert_refused, fingerprint, invoke
from tests.support.checks import assert_valid_output

BLOCK = 128
FP8_MAX = 448.0  # largest finite F8_E4M3FN
CONFIG = {
    "model_type": "deepseek_v3",
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
    },
}


def _expand(scales: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """One scale per element: each block's scale repeated over its (possibly partial) block."""
    rows = scales.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return rows[: shape[0], : shape[1]]


def block_scales(weights: list[torch.Tensor]) -> torch.Tensor:
    """Per-block scales covering every weight given: amax over all of them / FP8_MAX."""
    rows, cols = -(-weights[0].shape[0] // BLOCK), -(-weights[0].shape[1] // BLOCK)
    amax = torch.zeros(rows, cols)
    for weight in weights:
        padded = torch.zeros(rows * BLOCK, cols * BLOCK)
        padded[: weight.shape[0], : weight.shape[1]] = weight.abs()
        blocks = padded.reshape(rows, BLOCK, cols, BLOCK).amax(dim=(1, 3))
        amax = torch.maximum(amax, blocks)
    return amax / FP8_MAX


def quantize(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return (weight / _expand(scales, weight.shape)).to(torch.float8_e4m3fn)


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return values.float() * _expand(scales, values.shape)


def fp8_checkpoint(folder, weight: torch.Tensor, scales: torch.Tensor):
    folder.mkdir(parents=True)
    state = {
        "model.layers.0.mlp.down_proj.weight": quantize(weight, scales),
        "model.layers.0.mlp.down_proj.weight_scale_inv": scales,
        "model.layers.0.input_layernorm.weight": torch.ones(8, dtype=torch.bfloat16),
    }
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


WEIGHT = "model.layers.0.mlp.down_proj.weight"
SCALE = WEIGHT + "_scale_inv"


@pytest.fixture
def weights():
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(256, 200, generator=gen) * 0.02  # a partial block of columns
    second = first + torch.randn(256, 200, generator=gen) * 0.01
    return first, second


def test_a_soup_with_shared_scales_is_the_blend_of_the_weights(weights, tmp_path):
    scales = block_scales(list(weights))
    experts = [fp8_checkpoint(tmp_path / f"e{i}", w, scales) for i, w in enumerate(weights)]
    result = invoke("soup", "-q", *experts, tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = assert_valid_output(tmp_path / "out")
    assert torch.equal(out[SCALE], scales)  # copied, never blended
    inputs = [load_file(e / "model.safetensors") for e in experts]
    mean = sum(dequantize(s[WEIGHT], s[SCALE]) for s in inputs) / 2
    # avg(q_i * s) = avg(q_i) * s: the mean requantized with the shared scales is the mean of q
    # (exact in float32), rounded once to F8_E4M3.
    exact = ((inputs[0][WEIGHT].float() + inputs[1][WEIGHT].float()) / 2).to(torch.float8_e4m3fn)
    assert torch.equal(out[WEIGHT].view(torch.uint8), exact.view(torch.uint8))
    error = (dequantize(out[WEIGHT], out[SCALE]) - mean).norm() / mean.norm()
    assert error < 2**-4  # F8_E4M3's rounding (3 mantissa bits), no more


def test_fp8_blends_with_different_scales_are_refused(weights, tmp_path):
    # One outlier changes one block's scale: averaging q and s apart would be 55% off.
    second = weights[1].clone()
    second[3, 5] = 1.0
    experts = [
        fp8_checkpoint(tmp_path / f"e{i}", w, block_scales([w])) for i, w in enumerate(weights)
    ]
    experts[1] = fp8_checkpoint(tmp_path / "outlier", second, block_scales([second]))
    before = fingerprint(*experts)
    out = tmp_path / "out"
    assert_refused(invoke("soup", "-q", *experts, out), out, message="different scales")
    result = invoke("interpolate", "-q", "--alpha", "0.5", *experts, out)
    assert_refused(result, out, message="different scales")
    # Copies keep each weight with its own scale: alpha 1 is TRAINED, scales and all.
    result = invoke("interpolate", "-q", "--alpha", "1", *experts, out)
    assert result.exit_code == 0, result.output
    assert torch.equal(load_file(out / "model.safetensors")[SCALE], block_scales([second]))
    assert fingerprint(*experts) == before


@pytest.mark.parametrize(
    "command",
    [["soup"], ["interpolate", "--alpha", "0.5"], ["revert", "--layers", "0"]],
)
def test_dtype_on_fp8_with_scales_is_refused(weights, tmp_path, command):
    # --dtype bf16 would cast q and leave the scale aside: the weight would be q, not q * s.
    scales = block_scales(list(weights))
    experts = [fp8_checkpoint(tmp_path / f"e{i}", w, scales) for i, w in enumerate(weights)]
    out = tmp_path / "out"
    result = invoke(*command, "-q", "--dtype", "bf16", *experts, out)
    assert_refused(result, out, message="would cast FP8 values without their scales")


def _linear(tmp_path, experts, out: str, **extra):
    import yaml

    models = [{"model": str(e), "parameters": {"weight": 1.0}} for e in experts]
    config = {"merge_method": "linear", "models": models, **extra}
    path = tmp_path / f"{out}.yml"
    path.write_text(yaml.safe_dump(config))
    return invoke("merge", "-q", path, tmp_path / out)


def test_linear_merges_of_fp8_follow_the_same_rules(weights, tmp_path):
    shared = block_scales(list(weights))
    same = [fp8_checkpoint(tmp_path / f"s{i}", w, shared) for i, w in enumerate(weights)]
    result = _linear(tmp_path, same, "merged")
    assert result.exit_code == 0, result.output
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert invoke("soup", "-q", *same, tmp_path / "soup").exit_code == 0
    assert all(
        torch.equal(t.view(torch.uint8), merged[k].view(torch.uint8))
        for k, t in load_file(tmp_path / "soup" / "model.safetensors").items()
    )
    apart = [
        fp8_checkpoint(tmp_path / f"a{i}", w, block_scales([w])) for i, w in enumerate(weights)
    ]
    assert_refused(_linear(tmp_path, apart, "a"), tmp_path / "a", message="different scales")
    result = _linear(tmp_path, same, "b", dtype="bfloat16")
    assert_refused(result, tmp_path / "b", message="without their scales")
