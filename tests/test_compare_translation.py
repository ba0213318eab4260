"""`surgery compare` on translation units: the axis over all directions beside each direction's
(into and out of English), and the outputs' diagnostics, both by hand from the samples."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cli import cli
from eval.study.compare import compare
from eval.study.formatting import ALL_DIRECTIONS
from eval.study.results import read_results, write_samples
from tests.support.study_dirs import Study, read_lines, write_results

FAMILIES = {
    "slavic": {"held_in": ["ces_Latn", "pol_Latn"], "held_out": ["hsb_Latn"]},
    "germanic": {"held_in": ["deu_Latn"], "held_out": ["ltz_Latn"]},
}
INTO, OUT_OF = "{lang}-eng_Latn", "eng_Latn-{lang}"
STOPS = ("newline", "eos", "limit")


def with_outputs(folder, seed):
    """Give each translation sample a stop reason, and empty some outputs (as a model that
    stopped at a leading newline would), rewriting the samples through the format's writer."""
    rng = np.random.default_rng(seed)
    for unit in read_results(folder).units:
        if unit.kind != "flores":
            continue
        lines = read_lines(folder, unit.id)
        for line in lines:
            line["stop"] = STOPS[rng.choice(3, p=[0.5, 0.4, 0.1])]
            if rng.random() < 0.15:
                line["hypothesis"] = line["generation"] = ""
        write_samples(folder, unit.id, lines)
    return folder


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    spec = Study(families=FAMILIES, others=["fra_Latn"])
    spec.tasks["flores"]["directions"] = [OUT_OF, INTO]
    base = with_outputs(write_results(root / "base", spec, "base", 0.0, seed=1), 1)
    expert = with_outputs(write_results(root / "expert", spec, "expert", 0.5, seed=2), 2)
    return base, expert, compare(base, [expert], resamples=200, seed=0)


def rows(comparison, **where):
    return [r for r in comparison.rows if all(r[k] == v for k, v in where.items())]


def one(comparison, **where):
    (row,) = rows(comparison, **where)
    return row


def test_direction_macros_are_means_of_their_rows(study):
    _base, _expert, comparison = study
    variants = [a["variant"] for a in comparison.axes if a["task"] == "flores"]
    assert variants == [OUT_OF, INTO, ALL_DIRECTIONS]  # the combined axis comes last
    for model in comparison.models:
        common = dict(model=model, task="flores", metric="chrf")
        for split in ("held_in", "held_out"):
            families = []
            for family, splits in FAMILIES.items():
                langs = splits[split]
                by_direction = {}
                for variant in (OUT_OF, INTO):
                    values = [
                        one(comparison, **common, variant=variant, scope="language", lang=lang)
                        for lang in langs
                    ]
                    macro = one(
                        comparison, **common, variant=variant, scope="family", family=family,
                        split=split,
                    )  # fmt: skip
                    assert macro["value"] == pytest.approx(np.mean([v["value"] for v in values]))
                    by_direction[variant] = [v["value"] for v in values]
                combined = [
                    one(comparison, **common, variant=ALL_DIRECTIONS, scope="language", lang=lang)
                    for lang in langs
                ]
                for i, row in enumerate(combined):  # each language: the mean of its directions
                    both = (by_direction[OUT_OF][i], by_direction[INTO][i])
                    assert row["value"] == pytest.approx(np.mean(both))
                family_row = one(
                    comparison, **common, variant=ALL_DIRECTIONS, scope="family", family=family,
                    split=split,
                )  # fmt: skip
                expected = np.mean([row["value"] for row in combined])
                assert family_row["value"] == pytest.approx(expected)
                # Both directions of every language: also the mean over (language, direction).
                expected = np.mean(by_direction[OUT_OF] + by_direction[INTO])
                assert family_row["value"] == pytest.approx(expected)
                families.append(family_row["value"])
            overall = one(
                comparison, **common, variant=ALL_DIRECTIONS, scope="overall", split=split
            )
            assert overall["value"] == pytest.approx(np.mean(families))
        others = one(comparison, **common, variant=ALL_DIRECTIONS, scope="overall", split="others")
        fra = one(comparison, **common, variant=ALL_DIRECTIONS, scope="language", lang="fra_Latn")
        assert others["value"] == pytest.approx(fra["value"])
    expert = one(comparison, model="expert", task="flores", variant=ALL_DIRECTIONS,
                 scope="overall", split="held_in")  # fmt: skip
    assert expert["ci_low"] < expert["delta"] < expert["ci_high"]
    tests = [t for t in comparison.sign_tests if t["variant"] == ALL_DIRECTIONS]
    assert {(t["split"], t["over"]) for t in tests} >= {("held_in", "families")}


KEYS = ("n", "truncation_rate", "eos_rate", "limit_rate", "empty_rate", "length_p50",
        "length_p90", "length_p95", "length_p99")  # fmt: skip


def pooled(folders_lines):
    outputs = [line["hypothesis"] for line in folders_lines]
    stops = [line["stop"] for line in folders_lines]
    n = len(outputs)
    lengths = sorted(len(o) for o in outputs)
    by_hand = {
        "n": n,
        "truncation_rate": stops.count("newline") / n,
        "eos_rate": stops.count("eos") / n,
        "limit_rate": stops.count("limit") / n,
        "empty_rate": outputs.count("") / n,
    }
    by_hand |= {f"length_p{q}": lengths[round((n - 1) * q / 100)] for q in (50, 90, 95, 99)}
    return by_hand


def test_output_diagnostics_by_hand_from_the_samples(study):
    base, expert, comparison = study
    for folder, model in ((base, "base"), (expert, "expert")):

        def lines(lang, variant, folder=folder):
            return read_lines(folder, f"flores/{lang}/{variant.format(lang=lang)}")

        def found(model=model, **where):
            (row,) = [
                r for r in comparison.outputs
                if r["model"] == model and all(r[k] == v for k, v in where.items())
            ]  # fmt: skip
            return {k: row[k] for k in KEYS}

        assert found(variant=INTO, scope="language", lang="pol_Latn") == pooled(
            lines("pol_Latn", INTO)
        )
        slavic_in = FAMILIES["slavic"]["held_in"]
        assert found(variant=OUT_OF, scope="family", family="slavic", split="held_in") == pooled(
            [x for lang in slavic_in for x in lines(lang, OUT_OF)]
        )
        held_in = [lang for f in FAMILIES.values() for lang in f["held_in"]]
        assert found(variant=ALL_DIRECTIONS, scope="overall", split="held_in") == pooled(
            [x for lang in held_in for v in (OUT_OF, INTO) for x in lines(lang, v)]
        )
        assert found(variant=INTO, scope="overall", split="others") == pooled(
            lines("fra_Latn", INTO)
        )
    assert not [r for r in comparison.outputs if r["scope"] == "family" and r["family"] is None]


def test_report_csv_and_json_carry_them(study, tmp_path):
    base, expert, _comparison = study
    out = tmp_path / "report"
    result = CliRunner().invoke(
        cli, ["compare", str(expert), "--base", str(base), "-o", str(out), "--resamples", "50",
              "--jobs", "1", "-q"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "## flores all directions · chrf, higher is better" in report
    assert "## Translation outputs" in report
    assert "| flores each language→eng_Latn | in | expert |" in report
    assert "- directions: a task scored in several directions (flores)" in report
    data = json.loads((out / "comparison.json").read_text())
    scopes = [row["scope"] for row in data["translation_outputs"]]
    assert set(scopes) == {"overall", "family", "language"}
    assert data["format"] == "surgery-compare/2"  # only added keys, rows and axes


def test_a_suite_without_translation_reports_no_outputs(tmp_path):
    spec = Study(families=FAMILIES)
    del spec.tasks["flores"]
    base = write_results(tmp_path / "base", spec, "base", 0.0, seed=1)
    other = write_results(tmp_path / "other", spec, "other", 0.3, seed=2)
    comparison = compare(base, [other], resamples=20)
    assert comparison.outputs == []
    assert not any(a["variant"] == ALL_DIRECTIONS for a in comparison.axes)
