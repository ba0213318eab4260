"""Suites: the suite file, `surgery eval MODEL --suite`, and its results folder."""

from __future__ import annotations

import json
import math

import pytest

from eval.errors import SuiteError
from eval.study import results as res


def _results(units=(), complete=False) -> res.SuiteResults:
    suite = {"families": {"f": {"held_in": ["ces_Latn"], "held_out": []}}}
    return res.SuiteResults(
        model=res.ModelInfo("m", "m"),
        suite=suite,
        suite_sha256=res.suite_sha256(suite),
        settings={"seed": 0},
        units=tuple(units),
        missing=(res.MissingUnit("piqa", "ces_Latn", "p/ces_Latn.jsonl"),),
        complete=complete,
    )


def test_results_round_trip_without_nan(tmp_path):
    unit = res.UnitResult(
        id="belebele/ces_Latn",
        task="belebele",
        kind="belebele",
        variant=None,
        lang="ces_Latn",
        family="f",
        split="held_in",
        fewshot_seed=None,
        metrics={"acc": 0.5, "acc_stderr": math.nan, "n": 1},
        samples=res.write_samples(tmp_path, "belebele/ces_Latn", [{"doc_id": "0", "acc": 1}]),
        data=res.DataRef("b.jsonl", "0" * 64),
    )
    res.write_results(tmp_path, _results([unit], complete=True))
    text = (tmp_path / "results.json").read_text(encoding="utf-8")
    assert "NaN" not in text and json.loads(text)["format"] == res.FORMAT
    back = res.read_results(tmp_path)
    assert back.unit("belebele/ces_Latn").metrics["acc_stderr"] is None
    assert back.units[0].data == unit.data and back.missing == _results().missing
    assert res.read_samples(tmp_path, back.units[0]) == [{"doc_id": "0", "acc": 1}]
    assert unit.samples == "samples/belebele__ces_Latn.jsonl"


def test_read_results_refuses_what_is_not_a_results_folder(tmp_path):
    with pytest.raises(SuiteError, match="no such file"):
        res.read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"format": "other"}', encoding="utf-8")
    with pytest.raises(SuiteError, match="format 'other'"):
        res.read_results(tmp_path)
