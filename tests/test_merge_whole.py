"""A tensor computed in one job, which keeps what its reduction passes found per element (DARE's
masks, sce's variance keys), against the same tensor mapped in segments, which computes them
again in each pass: the same bytes (on float32 gpt2, and on bf16 Llama experts whose MLP weights
span 2.25 chunks), and the segmented path against mergekit for sce."""

from __future__ import annotations

import pytest

from surgery.engine.ops.merge import sce, sparsify, task_arithmetic
from tests.support.checks import assert_valid_output, load_state, same_bits
from tests.test_merge import mergekit_run, models, surgery_run
from tests.test_merge_more import _beyond_rounding, wide_bf16  # noqa: F401 (a fixture)

CASES = [
    ("dare_ties", [{"weight": 0.6, "density": 0.5}, {"weight": 0.3, "density": 0.7}], {}),
    ("dare_linear", [{"weight": 0.6, "density": 0.4}, {"weight": 0.5, "density": 0.9}], {}),
    ("sce", [{}, {}, {}], {"select_topk": 0.3}),
]


@pytest.fixture(scope="module")
def gpt2(families) -> dict:
    return families("gpt2")


def _run(config: dict, tmp_path, name: str, patch: pytest.MonkeyPatch, whole: bool) -> tuple:
    """The merge's tensors, and which way each kernel ran: "whole" where a job kept its
    per-element results, "segments" where it computed them again."""
    if not whole:  # the limits of a job that keeps per-element results: no tensor fits
        patch.setattr(task_arithmetic, "WHOLE_ELEMENTS", 0)
        patch.setattr(sce, "HELD_BYTES", 0)
    ways: set[str] = set()
    hold, measure = sce.Sce._hold, sparsify.Sparsifier.measure

    def held(self, inputs):
        ways.add("whole")
        return hold(self, inputs)

    def measured(self, start, delta, scratch=None):
        ways.add("whole" if self.remember_below else "segments")
        return measure(self, start, delta, scratch)

    patch.setattr(sce.Sce, "_hold", held)
    patch.setattr(sparsify.Sparsifier, "measure", measured)
    state = assert_valid_output(surgery_run(config, tmp_path, name))
    if config["merge_method"] == "sce" and "whole" not in ways:
        ways.add("segments")
    return state, ways


@pytest.mark.parametrize("family", ["gpt2", "wide_bf16"])
@pytest.mark.parametrize(("method", "params", "shared"), CASES)
def test_one_job_and_segments_write_the_same_bytes(
    request, tmp_path, monkeypatch, method, params, shared, family
):
    config = {"merge_method": method, **models(request.getfixturevalue(family), params)}
    config["parameters"] = shared
    with monkeypatch.context() as patch:
        whole, ways = _run(config, tmp_path, "whole", patch, whole=True)
    assert ways == {"whole"}
    with monkeypatch.context() as patch:
        segments, ways = _run(config, tmp_path, "segments", patch, whole=False)
    assert ways == {"segments"}
    assert set(whole) == set(segments)
    assert all(same_bits(whole[k], segments[k]) for k in whole)
    if method == "sce" and family == "gpt2":  # float32: no tied variances, mergekit the oracle
        theirs = mergekit_run(config, tmp_path / "mergekit")
        inputs = [load_state(m["model"]) for m in config["models"]]
        inputs.append(load_state(config["base_model"]))
        far = _beyond_rounding(segments, theirs, inputs)
        assert not far, far
