"""sce's shortcuts write the bytes of its plain passes: the threshold's window found in the
first pass over the variance keys (and found again where it misses), masks kept as bits for a
segmented map (and computed again without them), the map in split order (and an overflow there
refused as in plain order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from surgery.engine.ops.merge import sce, select
from surgery.engine.ops.merge.arrays import Inputs
from tests.hostile.support import assert_refused, fingerprint, invoke
from tests.support.checks import assert_valid_output, same_bits
from tests.test_merge import models, surgery_run
from tests.test_merge_more import wide_bf16  # noqa: F401 (a fixture)

# Every way below selects on a sample (sample_positions gives one for these tensors), as the
# 0.97B checkpoints' larger tensors do.
SAMPLED = {"WHOLE_BYTES": 0, "SAMPLE_SIZE": 64}


def _config(family: dict) -> dict:
    config = {"merge_method": "sce", "dtype": "float32", "out_dtype": "bfloat16"}
    return config | models(family, [{}, {}, {}]) | {"parameters": {"select_topk": 0.5}}


@pytest.fixture(scope="module")
def reference(wide_bf16, tmp_path_factory) -> dict:  # noqa: F811 (the fixture)
    """The merge with every sce shortcut in place, keys held, sampled selection."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SAMPLED.items():
            patch.setattr(select, name, value)
        ran = _record_windows(patch)
        state = assert_valid_output(surgery_run(_config(wide_bf16), tmp_path_factory.mktemp("r")))
    assert ran and set(ran) == {(True, False)}  # every window found in the first pass
    return state


def _record_windows(patch: pytest.MonkeyPatch, mislead: bool = False) -> list[tuple]:
    """(in a first pass, missed) for each window selection; `mislead`: the first pass's window
    holds the largest possible key alone, never the threshold's."""
    missed: list[tuple] = []
    window = select._in_window

    def recorded(keys, sample, ranks, numel, deferred=None):
        if mislead and deferred:  # a window of the largest key alone
            sample = np.full_like(sample, np.iinfo(sample.dtype).max)
        args = (keys, sample, ranks, numel)
        found = window(*args, deferred) if deferred else window(*args)
        missed.append((deferred is not None, found is None))
        return found

    patch.setattr(select, "_in_window", recorded)
    return missed


@pytest.mark.parametrize(
    "patches",
    [
        # The first pass's window misses: a selection of its own finds the threshold (a sample
        # large enough to bound the window).
        {"mislead": True, "SAMPLE_SIZE": 4096},
        # Windows over their bound: the first pass stops keeping keys but still counts.
        {"WINDOW_BYTES": 64},
        # Keys not held (segments): masks kept as bits from the mean-square pass.
        {"HELD_BYTES": 0},
        # Nor masks: the map computes the variances again.
        {"HELD_BYTES": 0, "MASK_BYTES": 0},
        # Inputs that cannot be gathered (a Hub file read by ranges): no sample before the
        # first pass; a job that holds its keys samples them after it.
        {"gather": False},
    ],
    ids=[
        "window missed",
        "window over its bound",
        "segments",
        "segments without masks",
        "no gathering",
    ],
)
def test_every_way_writes_the_reference_bytes(wide_bf16, reference, tmp_path, patches):  # noqa: F811
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SAMPLED.items():
            patch.setattr(select, name, value)
        if "gather" in patches:
            patch.setattr(Inputs, "gather", lambda *_: None)
        for name, value in patches.items():
            if name not in ("mislead", "gather"):
                patch.setattr(
                    select if name.isupper() and hasattr(select, name) else sce, name, value
                )
        ran = _record_windows(patch, mislead="mislead" in patches)
        ours = assert_valid_output(surgery_run(_config(wide_bf16), tmp_path))
    if "mislead" in patches:  # each first window missed, then a selection of its own ran
        first = [missed for deferred, missed in ran if deferred]
        assert first and all(first) and len(ran) == 2 * len(first)
    assert set(ours) == set(reference)
    assert all(same_bits(ours[k], reference[k]) for k in ours)


def test_sce_refuses_bf16_overflow_in_split_order(tmp_path, recwarn):
    # bf16 in and out: the map runs in split order, where an overflow is found before any byte
    # is written, then counted in plain order: the same one-line refusal as every merge, and no
    # numpy warning from the passes before it (they run as jobs of their own).
    inputs = tmp_path / "inputs"
    big = torch.full((1024,), 3e38, dtype=torch.bfloat16)
    states = {"base": big, "e1": big * 0, "e2": -big, "e3": big * 0.5}
    paths = {}
    for name, value in states.items():
        (inputs / name).mkdir(parents=True)
        save_file({"w": value}, inputs / name / "model.safetensors")
        paths[name] = str(inputs / name)
    config = {
        "merge_method": "sce",
        "base_model": paths["base"],
        "models": [{"model": paths[name]} for name in ("e1", "e2", "e3")],
        "parameters": {"select_topk": 1.0},
        "dtype": "bfloat16",
    }
    (tmp_path / "sce.yml").write_text(yaml.safe_dump(config))
    before = fingerprint(inputs)
    out = tmp_path / "out"
    result = invoke("merge", "-q", tmp_path / "sce.yml", out)
    assert_refused(result, out, message="'w': 1024 value(s) overflow BF16")
    assert fingerprint(inputs) == before
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
