"""Overflow at the one rounding (issue 24, items 3 and 4): the merge kernels refuse it as the
blends do, and the check sees the value the final rounding sees (float64 goes through float32
before a 16-bit dtype, so 65519.999 becomes 65520.0 and then inf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from surgery.engine.float_codec import encode, may_overflow
from tests.hostile.support import assert_refused, fingerprint, invoke

# float64 values around the 16-bit thresholds: 65520 (F16) and bf16's (0x7F7F8000 as float32),
# a few float32 ulps either side, in float64 steps much finer than float32's.
_BF16_LIMIT = float(np.array(0x7F7F8000, np.uint32).view(np.float32))


def _around(limit: float) -> np.ndarray:
    ulp = float(np.spacing(np.float32(limit)))
    steps = np.linspace(-3 * ulp, 3 * ulp, 2001)
    return np.concatenate([limit + steps, -(limit + steps)])


@pytest.mark.parametrize(("dtype", "limit"), [("F16", 65520.0), ("BF16", _BF16_LIMIT)])
def test_overflow_check_sees_the_float32_rounding_of_float64_values(dtype, limit):
    # Oracle: torch's float64 -> float32 -> 16-bit conversion (what `encode` does with numpy).
    values = _around(limit)
    target = torch.float16 if dtype == "F16" else torch.bfloat16
    overflows = ~torch.from_numpy(values).float().to(target).isfinite().numpy()
    assert overflows.any() and not overflows.all()
    # Each value alone: the check says "might overflow" exactly when the rounding does.
    predicted = np.array([may_overflow(values[i : i + 1], dtype) for i in range(len(values))])
    assert np.array_equal(predicted, overflows)
    # And `encode` rounds as torch does (bf16's bits: an all-ones exponent is inf or NaN).
    encoded = encode(values, dtype)
    exponent = encoded.view(np.uint16) & (0x7C00 if dtype == "F16" else 0x7F80)
    assert np.array_equal(exponent == (0x7C00 if dtype == "F16" else 0x7F80), overflows)


def _checkpoint(folder: Path, state: dict) -> Path:
    folder.mkdir(parents=True)
    save_file(state, folder / "model.safetensors")
    return folder


@pytest.fixture
def big(tmp_path) -> dict:
    """A zero base and two experts of 70000s (finite in float32, beyond float16's 65504)."""
    inputs = tmp_path / "inputs"
    return {
        "base": _checkpoint(inputs / "base", {"w": torch.zeros(8)}),
        "experts": [_checkpoint(inputs / f"e{i}", {"w": torch.full((8,), 7e4)}) for i in (1, 2)],
    }


def _config(tmp_path: Path, paths: dict, method: str, out_dtype: str = "float16") -> Path:
    models = [{"model": str(e), "parameters": {"weight": 1.0}} for e in paths["experts"]]
    config = {"merge_method": method, "out_dtype": out_dtype, "models": models}
    if method != "linear":
        config["base_model"] = str(paths["base"])
    path = tmp_path / f"{method}.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "method", ["task_arithmetic", "ties", "breadcrumbs", "dare_linear", "della", "linear"]
)
def test_merges_refuse_overflow_of_the_output_dtype(big, tmp_path, method):
    # The merge kernels (every method but linear, a blend) wrote inf with exit 0 and printed
    # numpy's warnings; now the same one-line error as a blend's, and nothing is written.
    before = fingerprint(tmp_path / "inputs")
    out = tmp_path / "out"
    result = invoke("merge", "-q", _config(tmp_path, big, method), out)
    assert_refused(result, out, message="'w': 8 value(s) overflow F16")
    assert fingerprint(tmp_path / "inputs") == before


def test_merge_passes_input_nans_and_writes_what_fits(big, tmp_path):
    # Non-finite values already in an input pass through, as in blends; a wider out_dtype fits.
    (big["experts"][0] / "model.safetensors").unlink()
    values = torch.full((8,), 7e4)
    values[3] = float("nan")
    save_file({"w": values}, big["experts"][0] / "model.safetensors")
    result = invoke(
        "merge", "-q", _config(tmp_path, big, "task_arithmetic", "float32"), tmp_path / "o"
    )
    assert result.exit_code == 0, result.output
    merged = load_file(tmp_path / "o" / "model.safetensors")["w"]
    assert merged[3].isnan() and (merged[torch.arange(8) != 3] == 1.4e5).all()


@pytest.mark.parametrize("command", ["soup", "revert"])
def test_float64_values_just_below_the_threshold_are_refused(tmp_path, command):
    # 65519.999 < 65520 in float64, but float32 rounds it to 65520.0, which float16 rounds to inf.
    state = {
        f"model.layers.{i}.w": torch.full((4,), 65519.999, dtype=torch.float64) for i in (0, 1)
    }
    a = _checkpoint(tmp_path / "inputs" / "a", state)
    b = _checkpoint(tmp_path / "inputs" / "b", state)
    out = tmp_path / "out"
    layers = ["--layers", "0"] if command == "revert" else []
    result = invoke(command, "--dtype", "fp16", *layers, a, b, out)
    assert_refused(result, out, message="4 value(s) overflow F16")
