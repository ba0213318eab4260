"""The tokenizer as a recorded setting: its files' hash, and what `compare` refuses when it
differs (token perplexity only)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from cli import cli
from eval.study.compare import compare
from eval.study.tokenizer_id import SETTING, tokenizer_sha256
from tests.support.study_dirs import Study, read_lines, write_results

FAMILIES = {
    "slavic": {"held_in": ["ces_Latn", "pol_Latn"], "held_out": ["hsb_Latn"]},
    "germanic": {"held_in": ["deu_Latn"], "held_out": ["ltz_Latn"]},
}


def test_the_hash_is_the_files_not_their_folder(tmp_path, families):
    base = families("llama")["base"]
    files = [p for p in base.iterdir() if p.is_file()]
    for name in ("one", "two/nested"):
        (tmp_path / name).mkdir(parents=True)
        for path in files:
            shutil.copy(path, tmp_path / name / path.name)
    digest = tokenizer_sha256(tmp_path / "one")
    assert digest is not None and digest == tokenizer_sha256(tmp_path / "two/nested")
    # Weights and the model config are not the tokenizer; its own files are.
    (tmp_path / "one/config.json").write_text("{}")
    next((tmp_path / "one").glob("*.safetensors")).write_bytes(b"other weights")
    assert tokenizer_sha256(tmp_path / "one") == digest
    data = json.loads((tmp_path / "two/nested/tokenizer.json").read_text())
    data["added_tokens"].append({**data["added_tokens"][-1], "id": 999, "content": "<grown>"})
    (tmp_path / "two/nested/tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_sha256(tmp_path / "two/nested") != digest
    assert tokenizer_sha256(tmp_path / "empty") is None


def _study(tmp_path, tokenizers):
    """Base, `grown` and `soup` results folders, each recording its tokenizer's hash."""
    spec = Study(families=FAMILIES)
    models = (("base", 0.0, 1), ("grown", 0.4, 2), ("soup", 0.2, 3))
    return [
        write_results(tmp_path / name, spec, name, skill, seed=seed, settings={SETTING: digest})
        for (name, skill, seed), digest in zip(models, tokenizers, strict=True)
    ]


def _values(comparison):
    return {
        (r["model"], r["task"], r["variant"], r["metric"], r["scope"], r["lang"], r["split"]): r
        for r in comparison.rows
    }


def test_compare_refuses_token_perplexity_alone_across_tokenizers(tmp_path):
    same = _study(tmp_path / "same", ["a" * 64] * 3)
    mixed = _study(tmp_path / "mixed", ["a" * 64, "b" * 64, "a" * 64])
    with_same = compare(same[0], same[1:], resamples=100)
    with_mixed = compare(mixed[0], mixed[1:], resamples=100)
    assert with_same.refused == []
    (reason,) = with_mixed.refused
    assert "Token perplexity (ppl) is not compared" in reason and str(mixed[1]) in reason
    # Token perplexity is gone; every other metric is compared, with the same values.
    kept, full = _values(with_mixed), _values(with_same)
    assert {key for key in full if key[3] != "ppl"} == set(kept)
    assert not any(key[3] == "ppl" for key in kept)
    for key, row in kept.items():
        assert row["value"] == pytest.approx(full[key]["value"]), key
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(
            (full[key]["ci_low"], full[key]["ci_high"])
        ), key
    assert {k for k in kept if k[2:4] == (None, "word_perplexity")}
    # Byte perplexity by hand, from the per-item logs.
    lines = read_lines(mixed[1], "ppl/ces_Latn")
    nll = -sum(x["loglikelihood"] for x in lines)
    row = kept[("grown", "ppl", None, "byte_perplexity", "language", "ces_Latn", "held_in")]
    assert row["value"] == pytest.approx(math.exp(nll / sum(x["bytes"] for x in lines)))
    # The report's tables show byte perplexity for ppl, and say why.
    axes = [a for a in with_mixed.axes if a["task"] == "ppl" and a["primary"]]
    assert [a["metric"] for a in axes] == ["byte_perplexity"]
    out = tmp_path / "report"
    args = ["compare", mixed[1], mixed[2], "--base", mixed[0], "-o", out, "--resamples", 50]
    result = CliRunner().invoke(cli, [*map(str, args), "--jobs", "2", "-q"])
    assert result.exit_code == 0, result.output
    assert reason in (out / "report.md").read_text()
    data = json.loads((out / "comparison.json").read_text())
    assert data["refused"] == [reason]
    assert not [r for r in data["rows"] if r["metric"] == "ppl"]
    assert np.isfinite([r["value"] for r in data["rows"]]).all()


def test_results_without_a_recorded_tokenizer_compare_as_before(tmp_path):
    """Folders written before the tokenizer was recorded: all alike, nothing is refused."""
    spec = Study(families=FAMILIES)
    folders = [
        write_results(tmp_path / name, spec, name, skill, seed=seed)
        for name, skill, seed in (("base", 0.0, 1), ("dense", 0.5, 2))
    ]
    comparison = compare(folders[0], folders[1:], resamples=50)
    assert comparison.refused == []
    assert any(r["metric"] == "ppl" for r in comparison.rows)
