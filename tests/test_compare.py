"""`surgery compare`: values and macros by hand, bootstrap intervals against an independent
loop, chrF against sacrebleu's paired bootstrap, sign tests against scipy, refusals, outputs.

Results folders are written by tests/support/study_dirs.py through eval.study.results (the
format's own writer) with synthetic per-item outcomes that are correlated across models item by
item, as real models' are (so pairing matters).
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from sacrebleu.metrics import CHRF
from scipy.stats import binomtest

from bench.measure import measure
from cli import cli
from eval.errors import CompareError
from eval.study import stats
from eval.study.chrf_stats import chrf_statistics, supports
from eval.study.compare import cells_of, compare, compute_cell, load_runs
from eval.study.stats import (
    cell_seed,
    chrf_from_sums,
    count_blocks,
    resample_counts,
    resampled_sums,
    sign_test,
)
from tests.support.study_dirs import Study, read_lines, write_results

# Uneven families, so that the macro of macros differs from the mean over languages.
FAMILIES = {
    "slavic": {"held_in": ["ces_Latn", "pol_Latn", "slk_Latn"], "held_out": ["hsb_Latn"]},
    "germanic": {"held_in": ["deu_Latn"], "held_out": ["ltz_Latn"]},
}
DENSE = {"ces_Latn": 1.0, "pol_Latn": 0.8, "slk_Latn": 0.9, "deu_Latn": 1.0, "hsb_Latn": -0.6}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Base, `dense` (learns held-in, forgets held-out) and `soup` (a little of both)."""
    root = tmp_path_factory.mktemp("study")
    spec = Study(families=FAMILIES)
    base = write_results(root / "base", spec, "base", 0.0, seed=1)
    dense = write_results(root / "dense", spec, "dense", DENSE, seed=2)
    soup = write_results(root / "soup", spec, "soup", 0.3, seed=3)
    return SimpleNamespace(base=base, dense=dense, soup=soup)


def rows_of(comparison, **where):
    return [r for r in comparison.rows if all(r[k] == v for k, v in where.items())]


def one(comparison, **where):
    (row,) = rows_of(comparison, **where)
    return row


# Per-language values computed here from the samples lines, without eval.study.
def accuracy(lines, index=None):
    values = np.array([line["acc"] for line in lines], float)
    return 100 * (values if index is None else values[index]).mean()


def perplexity(lines, index=None):
    ll = np.array([line["loglikelihood"] for line in lines])
    tokens = np.array([line["tokens"] for line in lines], float)
    index = slice(None) if index is None else index
    return math.exp(-ll[index].sum() / tokens[index].sum())


def chrf(lines):
    hyps = [line["hypothesis"] for line in lines]
    return CHRF().corpus_score(hyps, [[line["reference"] for line in lines]]).score


def test_values_and_the_macro_of_macros_by_hand(study):
    base, dense, soup = study.base, study.dense, study.soup
    comparison = compare(base, [dense, soup], resamples=200, seed=0)
    assert comparison.models == ["base", "dense", "soup"]
    for task, metric, value in (
        ("belebele", "acc", accuracy),
        ("piqa", "acc", accuracy),
        ("ppl", "ppl", perplexity),
    ):
        per_lang = {
            lang: value(read_lines(dense, f"{task}/{lang}"))
            for f in FAMILIES.values()
            for lang in f["held_in"] + f["held_out"]
        }
        for lang, expected in per_lang.items():
            row = one(comparison, model="dense", task=task, metric=metric, lang=lang)
            assert row["value"] == pytest.approx(expected, rel=1e-12)
        slavic = np.mean([per_lang[x] for x in FAMILIES["slavic"]["held_in"]])
        germanic = per_lang["deu_Latn"]
        where = dict(model="dense", task=task, metric=metric, split="held_in")
        assert one(comparison, scope="family", family="slavic", **where)["value"] == pytest.approx(
            slavic
        )
        overall = one(comparison, scope="overall", **where)["value"]
        assert overall == pytest.approx((slavic + germanic) / 2)  # each family counts once
        held_in = [x for f in FAMILIES.values() for x in f["held_in"]]
        assert overall != pytest.approx(np.mean([per_lang[x] for x in held_in]))  # not over langs
        base_overall = one(comparison, **{**where, "model": "base"}, scope="overall")["value"]
        assert one(comparison, scope="overall", **where)["delta"] == pytest.approx(
            overall - base_overall
        )
    # FLORES: corpus chrF of the language's sentences, per direction.
    for variant in ("eng_Latn-{lang}", "{lang}-eng_Latn"):
        unit = f"flores/hsb_Latn/{variant.format(lang='hsb_Latn')}"
        row = one(comparison, model="soup", task="flores", variant=variant, lang="hsb_Latn")
        assert row["value"] == pytest.approx(chrf(read_lines(soup, unit)), abs=1e-9)


def loop_bootstrap(folders, unit_ids_by_family, value, resamples, seed):
    """The paired bootstrap of a macro of macros, written as plainly as possible: for every
    resample, every language's items drawn anew (the same draw for both models)."""
    rng = np.random.default_rng(seed)
    lines = {
        (f, u): read_lines(f, u) for f in folders for units in unit_ids_by_family for u in units
    }
    deltas = []
    for _ in range(resamples):
        family_means = {f: [] for f in folders}
        for units in unit_ids_by_family:
            per_lang = {f: [] for f in folders}
            for unit in units:
                index = rng.integers(0, len(lines[folders[0], unit]), len(lines[folders[0], unit]))
                for f in folders:
                    per_lang[f].append(value(lines[f, unit], index))
            for f in folders:
                family_means[f].append(np.mean(per_lang[f]))
        deltas.append(np.mean(family_means[folders[1]]) - np.mean(family_means[folders[0]]))
    return np.array(deltas)


@pytest.mark.parametrize(
    ("task", "metric", "value", "scope"),
    [
        ("belebele", "acc", accuracy, "language"),
        ("piqa", "acc", accuracy, "overall"),
        ("ppl", "ppl", perplexity, "family"),
        ("ppl", "ppl", perplexity, "overall"),
    ],
)
def test_paired_bootstrap_intervals_match_a_plain_loop(study, task, metric, value, scope):
    base, dense, _soup = study.base, study.dense, study.soup
    comparison = compare(base, [dense], resamples=4000, seed=7)
    held_in = {name: f["held_in"] for name, f in FAMILIES.items()}
    families = {"language": [["ces_Latn"]], "family": [held_in["slavic"]]}
    families = families.get(scope, list(held_in.values()))
    units = [[f"{task}/{lang}" for lang in langs] for langs in families]
    deltas = loop_bootstrap([base, dense], units, value, 2000, seed=11)
    where = dict(model="dense", task=task, metric=metric, scope=scope, split="held_in")
    if scope == "language":
        where["lang"] = "ces_Latn"
    elif scope == "family":
        where["family"] = "slavic"
    row = one(comparison, **where)
    expected = np.percentile(deltas, [2.5, 97.5])
    # Monte Carlo error of a 2.5% quantile from 2000 + 4000 resamples: about 0.08 standard
    # deviations of the resampled changes; allow four times that.
    tolerance = 0.3 * deltas.std()
    assert row["ci_low"] == pytest.approx(expected[0], abs=tolerance)
    assert row["ci_high"] == pytest.approx(expected[1], abs=tolerance)
    if scope == "language":  # pairing matters: resampling each model on its own is wider
        rng = np.random.default_rng(3)
        lines = [read_lines(f, units[0][0]) for f in (base, dense)]
        unpaired = [
            value(lines[1], rng.integers(0, 40, 40)) - value(lines[0], rng.integers(0, 40, 40))
            for _ in range(500)
        ]
        assert np.std(unpaired) > 1.25 * deltas.std()


def test_chrf_resamples_are_sacrebleus_paired_bootstrap(study):
    """Same generator, same resampled sentences: the system's bootstrap mean, its 95% half
    interval and the p-value of sacrebleu's paired bootstrap, from summed statistics."""
    from sacrebleu.significance import Result, _compute_p_value, _paired_bs_test, estimate_ci

    base, dense, _soup = study.base, study.dense, study.soup
    unit = "flores/ces_Latn/eng_Latn-ces_Latn"
    base_lines, sys_lines = read_lines(base, unit), read_lines(dense, unit)
    refs = [[line["reference"] for line in base_lines]]
    base_hyps = [line["hypothesis"] for line in base_lines]
    sys_hyps = [line["hypothesis"] for line in sys_lines]
    metric = CHRF()
    base_stats = metric._extract_corpus_statistics(base_hyps, refs)
    base_result = Result(metric._aggregate_and_compute(base_stats).score)
    resamples, seed = 1000, 5
    _, expected = _paired_bs_test(
        {"chrF2": (base_stats, base_result)}, "dense", sys_hyps, refs, {"chrF2": metric},
        n_samples=resamples, seed=seed,
    )  # fmt: skip
    counts = resample_counts(np.random.default_rng(seed), len(sys_hyps), resamples)
    sys_stats = np.array(metric._extract_corpus_statistics(sys_hyps, refs), float)
    scores_sys = chrf_from_sums(counts @ sys_stats, metric)
    scores_base = chrf_from_sums(counts @ np.array(base_stats, float), metric)
    mean, half = estimate_ci(scores_sys)
    result = expected["chrF2"]
    assert chrf_from_sums(sys_stats.sum(0), metric) == pytest.approx(result.score, abs=1e-9)
    assert mean == pytest.approx(result.mean, abs=1e-4)
    assert half == pytest.approx(result.ci, abs=1e-4)
    diffs = np.abs(scores_sys - scores_base)
    p = _compute_p_value(diffs - diffs.mean(), abs(result.score - base_result.score))
    assert p == pytest.approx(result.p_value, abs=2 / (resamples + 1))
    # And the comparison's own resamples of that cell, seeded by cell_seed, are sacrebleu's.
    runs = load_runs(base, [dense])
    cell = next(c for c in cells_of(runs[0].results) if c.units == (unit,))
    _, cell_result = compute_cell(runs, cell, resamples, 0)
    _, again = _paired_bs_test(
        {"chrF2": (base_stats, base_result)}, "dense", sys_hyps, refs, {"chrF2": metric},
        n_samples=resamples, seed=cell_seed(0, cell.key),
    )  # fmt: skip
    boot = cell_result.boot["chrf"].astype(np.float64)
    assert estimate_ci(boot[:, 1]) == pytest.approx(
        (again["chrF2"].mean, again["chrF2"].ci), abs=1e-3
    )


def whole_count_matrix(rng, n, resamples):
    """The count matrix as compare drew it before blocks, in one (B, n) draw: the oracle."""
    index = rng.choice(n, size=(resamples, n), replace=True)
    index += np.arange(resamples)[:, None] * n
    counts = np.bincount(index.ravel(), minlength=resamples * n)
    return counts.reshape(resamples, n).astype(np.float64)


@pytest.mark.parametrize(
    "n, resamples, block", [(7, 1000, 20), (1, 10, 1), (300, 41, 1000), (3, 999, 2), (50, 7, 10)]
)
def test_resamples_drawn_in_blocks_are_those_of_one_whole_draw(n, resamples, block):
    """Blocks of rows (block // n rows each, the last one shorter) hold the same counts, bit
    for bit, as one draw of the whole matrix from the same seed; sums of integer statistics
    are then exact and equal, sums of floats equal to float64 rounding."""
    blocks = list(count_blocks(np.random.default_rng(5), n, resamples, block))
    assert [len(b) for b in blocks[:-1]] == [max(1, block // n)] * (len(blocks) - 1)
    whole = whole_count_matrix(np.random.default_rng(5), n, resamples)
    assert np.array_equal(np.concatenate(blocks), whole)
    rng = np.random.default_rng(0)
    integers = rng.integers(0, 300, (n, 4)).astype(np.float64)  # outcomes, token counts
    sums = resampled_sums(np.random.default_rng(5), integers, resamples, block)
    assert np.array_equal(sums, whole @ integers)
    floats = -rng.random((n, 3)) * 500  # log-likelihoods
    sums = resampled_sums(np.random.default_rng(5), floats, resamples, block)
    # Each sum adds n non-positive terms: any order is within n ulps of the exact sum.
    bound = n * np.finfo(np.float64).eps * np.abs(whole @ floats)
    assert np.all(np.abs(sums - whole @ floats) <= bound)


def test_compare_in_blocks_gives_the_whole_draws_results(study, monkeypatch):
    """Every cell of the study (perplexity, accuracies, chrF), resampled in blocks of 3 to 40
    rows against one whole draw (a block larger than the matrix: the code before blocks):
    the same point values, the same float32 resampled metrics (perplexity within one float32
    ulp: its log-likelihood sums may differ in float64's last bits)."""
    runs = load_runs(study.base, [study.dense, study.soup])
    resamples = 300
    for cell in cells_of(runs[0].results):
        monkeypatch.setattr(stats, "BLOCK", 2**40)
        _, whole = compute_cell(runs, cell, resamples, 0)
        monkeypatch.setattr(stats, "BLOCK", 120)
        _, blocked = compute_cell(runs, cell, resamples, 0)
        assert blocked.point.keys() == whole.point.keys()
        for name in whole.point:
            assert np.array_equal(blocked.point[name], whole.point[name])
            if cell.kind == "ppl":
                np.testing.assert_allclose(blocked.boot[name], whole.boot[name], rtol=2**-23)
            else:
                assert np.array_equal(blocked.boot[name], whole.boot[name]), (cell.key, name)


RESAMPLE = """
import sys
import numpy as np
from eval.study.stats import resampled_sums
n, resamples = int(sys.argv[1]), int(sys.argv[2])
values = np.random.default_rng(0).random((n, 4))
resampled_sums(np.random.default_rng(0), values, resamples)
"""


def test_resampling_memory_does_not_grow_with_items():
    """Peak RssAnon of resampling 2,000 and 20,000 items (B = 1,000): one whole count matrix
    would cost 24 x B x n bytes (46 and 458 MiB); blocks cost the same for both."""
    peaks = {}
    for n in (2_000, 20_000):
        result = measure([sys.executable, "-c", RESAMPLE, str(n), "1000"])
        assert result.returncode == 0
        peaks[n] = result.peak_anon
    print({n: f"{peak / 2**20:.0f} MiB" for n, peak in peaks.items()})
    # The values grow by 0.6 MiB; three block-sized arrays are 24 MiB in all.
    assert peaks[20_000] - peaks[2_000] < 32 * 2**20, peaks


@pytest.mark.parametrize("word_order", [0, 2])
@pytest.mark.parametrize("eps_smoothing", [False, True])
def test_vectorized_chrf_is_sacrebleus_formula(word_order, eps_smoothing):
    metric = CHRF(word_order=word_order, eps_smoothing=eps_smoothing)
    rng = np.random.default_rng(0)
    stats = rng.integers(0, 30, size=(300, 3 * metric.order)).astype(float)
    stats[::7, 0::3] = 0  # empty hypotheses' orders
    stats[::11, 1::3] = 0  # and references'
    stats[:, 2::3] = np.minimum(stats[:, 2::3], stats[:, 0::3])  # matches <= counts
    expected = [metric._compute_f_score(list(s)) for s in stats]
    assert chrf_from_sums(stats, metric) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    "alphabet",
    ["aabcdeé žčñ\u3000\tx.,!Ωω", "".join(chr(0x4E00 + i) for i in range(3000)) + " "],
    ids=["latin", "cjk"],  # the second renumbers n-grams that would overflow int64
)
def test_unit_chrf_statistics_are_sacrebleus(alphabet):
    rng = np.random.default_rng(0)

    def text():
        return "".join(rng.choice(list(alphabet), size=int(rng.integers(0, 40))))

    refs = [text() for _ in range(200)] + ["", "abc", "aaaaaaaaaa", "  ", "ab"]
    hyps = [[text() for _ in refs] for _ in range(3)]
    hyps[0][-5:] = ["abc", "", "aaaa", "x", "ab ab"]
    metric = CHRF()
    assert supports(metric) and not supports(CHRF(word_order=2))
    ours = chrf_statistics(hyps, refs, metric.order)
    for run, hypotheses in enumerate(hyps):
        expected = metric._extract_corpus_statistics(hypotheses, [refs])
        assert ours[run].tolist() == expected


def test_chrf_plus_plus_units_are_scored_by_sacrebleus_chrf_plus_plus(study, tmp_path):
    """A FLORES unit scored with metric=chrf++ is compared in chrF++ (sacrebleu's statistics)."""

    def plus_plus(data):
        for unit in data["units"]:
            if unit["kind"] == "flores":
                unit["metrics"] = {"chrf++": 0.0, "n": unit["metrics"]["n"]}

    folders = []
    for name in ("base", "soup"):
        shutil.copytree(getattr(study, name), tmp_path / name)
        edit_json(tmp_path / name / "results.json", plus_plus)
        folders.append(tmp_path / name)
    comparison = compare(folders[0], folders[1:], resamples=100)
    unit = "flores/hsb_Latn/hsb_Latn-eng_Latn"
    lines = read_lines(folders[1], unit)
    hyps, refs = [x["hypothesis"] for x in lines], [[x["reference"] for x in lines]]
    row = one(comparison, model="soup", task="flores", lang="hsb_Latn", variant="{lang}-eng_Latn")
    assert row["metric"] == "chrf++"
    assert row["value"] == pytest.approx(CHRF(word_order=2).corpus_score(hyps, refs).score)


def test_sign_tests_are_scipys_binomtest(tmp_path):
    """Six held-in languages: wins and losses counted here, ties (an unchanged language)
    dropped, p from scipy; and over families."""
    families = {
        "a": {"held_in": ["aaa_Latn", "aab_Latn", "aac_Latn"], "held_out": ["aad_Latn"]},
        "b": {"held_in": ["bba_Latn", "bbb_Latn", "bbc_Latn"], "held_out": ["bbd_Latn"]},
    }
    spec = Study(families=families, tasks={"belebele": {"kind": "belebele", "n": 60}})
    base = write_results(tmp_path / "base", spec, "base", 0.0, seed=1)
    skill = {"aaa_Latn": 1, "aab_Latn": 1, "aac_Latn": -1, "bba_Latn": 1, "bbb_Latn": 1}
    other = write_results(tmp_path / "other", spec, "other", skill, seed=2)
    # bbc_Latn: the base's own lines, so an exact tie.
    shutil.copy(base / "samples/belebele__bbc_Latn.jsonl", other / "samples/")
    comparison = compare(base, [other], resamples=100)
    changes = [
        accuracy(read_lines(other, f"belebele/{x}")) - accuracy(read_lines(base, f"belebele/{x}"))
        for x in families["a"]["held_in"] + families["b"]["held_in"]
    ]
    wins = sum(c > 1e-9 for c in changes)
    losses = sum(c < -1e-9 for c in changes)
    assert wins + losses == 5  # the tie is dropped
    (test,) = [
        t
        for t in comparison.sign_tests
        if t["split"] == "held_in" and t["over"] == "languages" and t["metric"] == "acc"
    ]
    assert (test["wins"], test["losses"], test["ties"]) == (wins, losses, 1)
    assert test["p"] == binomtest(wins, wins + losses, 0.5).pvalue
    (fam,) = [
        t
        for t in comparison.sign_tests
        if t["split"] == "held_in" and t["over"] == "families" and t["metric"] == "acc"
    ]
    family_changes = [
        r["delta"]
        for r in rows_of(comparison, model="other", scope="family", split="held_in", metric="acc")
    ]
    fw = sum(c > 1e-9 for c in family_changes)
    fl = sum(c < -1e-9 for c in family_changes)
    assert (fam["wins"], fam["losses"]) == (fw, fl)
    assert fam["p"] == binomtest(fw, fw + fl, 0.5).pvalue


def test_sign_test_direction_and_all_ties():
    lower = sign_test([-1.0, -2.0, 0.5], higher_is_better=False)  # perplexity: lower wins
    assert (lower.wins, lower.losses) == (2, 1)
    assert sign_test([0.0, 1e-12], higher_is_better=True).p == 1.0


def test_fewshot_seeds_mean_and_population_std(tmp_path):
    spec = Study(
        families={"s": {"held_in": ["ces_Latn"], "held_out": ["hsb_Latn"]}},
        tasks={"belebele": {"kind": "belebele", "shots": 2, "n": 30}},
        fewshot_seeds=[1, 2, 3],
    )
    base = write_results(tmp_path / "base", spec, "base", 0.0, seed=1)
    other = write_results(tmp_path / "other", spec, "other", 0.5, seed=2)
    comparison = compare(base, [other], resamples=200)
    per_seed = [accuracy(read_lines(other, f"belebele/ces_Latn/seed={s}")) for s in (1, 2, 3)]
    row = one(comparison, model="other", scope="language", lang="ces_Latn", metric="acc")
    assert row["value"] == pytest.approx(np.mean(per_seed))
    assert row["seed_std"] == pytest.approx(np.std(per_seed))  # population std (ddof 0)
    assert row["seeds"] == 3


def refused(result, message, out):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    assert not out.exists()


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, sort_keys=True, indent=1))


def edit_first_line(path, change):
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    change(first)
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n")


def _shots(d):
    d["suite"]["tasks"]["belebele"]["options"]["shots"] = 5


def _limit(d):
    d["settings"]["limit"] = 10


def _dtype(d):
    d["settings"]["eval_dtype"] = "bf16"


def _data(d):
    d["units"][3]["data"]["sha256"] = "0" * 64


def _incomplete(d):
    d["complete"] = False


def _drop_unit(d):
    d["units"].pop()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_shots, "suite.tasks.belebele.options.shots is 5, not 2"),
        (_limit, "settings.limit is 10, not null"),
        (_dtype, 'settings.eval_dtype is "bf16", not "float32"'),
        (_data, "read other data"),
        (_incomplete, "incomplete results"),
        (_drop_unit, "is only in the base"),
    ],
)
def test_results_of_another_suite_settings_or_data_are_refused(study, tmp_path, change, message):
    base, dense, _soup = study.base, study.dense, study.soup
    other = tmp_path / "other"
    shutil.copytree(dense, other)
    edit_json(other / "results.json", change)
    out = tmp_path / "report"
    refused(run("compare", other, "--base", base, "-o", out, "--resamples", 10, "-q"), message, out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda line: line.update(prompt_sha256="f" * 64), "doc_id 0: the prompt differs"),
        (lambda line: line.update(doc_id="999"), "has other items than the base (doc_id 0)"),
    ],
)
def test_items_are_matched_by_doc_id_and_prompt(study, tmp_path, change, message):
    base, dense, _soup = study.base, study.dense, study.soup
    other = tmp_path / "other"
    shutil.copytree(dense, other)
    edit_first_line(other / "samples/piqa__deu_Latn.jsonl", change)
    out = tmp_path / "report"
    result = run("compare", other, "--base", base, "-o", out, "--resamples", 10, "--jobs", 1, "-q")
    refused(result, message, out)
    assert "piqa/deu_Latn" in result.stderr


def test_lm_eval_records_are_matched_by_their_prompt_hash(study, tmp_path):
    """lm-eval units log lm-eval's own records: integer doc ids, `prompt_hash`, metric fields."""

    def as_lm_eval(folder):
        path = folder / "samples/piqa__deu_Latn.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for line in lines:
            line["doc_id"] = int(line["doc_id"])
            line["prompt_hash"] = line.pop("prompt_sha256")
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    folders = []
    for name in ("base", "dense"):
        shutil.copytree(getattr(study, name), tmp_path / name)
        as_lm_eval(tmp_path / name)
        folders.append(tmp_path / name)
    comparison = compare(folders[0], folders[1:], resamples=50)
    row = one(comparison, model="dense", task="piqa", metric="acc", lang="deu_Latn")
    assert row["value"] == pytest.approx(accuracy(read_lines(folders[1], "piqa/deu_Latn")))
    path = folders[1] / "samples/piqa__deu_Latn.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), "prompt_hash": "0" * 64})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CompareError, match="doc_id 3: the prompt differs"):
        compare(folders[0], folders[1:], resamples=50)


def test_not_a_results_folder_is_refused(study, tmp_path):
    base, _dense, _soup = study.base, study.dense, study.soup
    out = tmp_path / "report"
    (tmp_path / "empty").mkdir()
    result = run("compare", tmp_path / "empty", "--base", base, "-o", out)
    refused(result, "results.json: no such file (not a suite results folder)", out)
    with pytest.raises(CompareError, match="besides --base"):
        compare(base, [base])


def test_report_csv_json_and_plots(study, tmp_path):
    base, dense, soup = study.base, study.dense, study.soup
    out = tmp_path / "report"
    args = ("compare", dense, soup, "--base", base, "-o", out, "--resamples", 500, "-q")
    result = run(*args, "--jobs", 2)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "change_heatmap.png", "comparison.csv", "comparison.json", "report.md", "tradeoff.png",
    ]  # fmt: skip
    for png in ("change_heatmap.png", "tradeoff.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "comparison.json").read_text(), parse_constant=pytest.fail)
    assert data["bootstrap"] == {
        "resamples": 500,
        "seed": 0,
        "interval": "paired bootstrap percentile 2.5/97.5",
        "p": "min(1, 2 * (1 + min(#{d <= 0}, #{d >= 0})) / (B + 1)) over resampled changes d",
        "min_items": 30,
    }
    assert data["bold"] == "interval" and data["adjustment"]["alpha"] == 0.05
    assert data["models"] == ["base", "dense", "soup"]
    with (out / "comparison.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(data["rows"])
    overall = next(
        r
        for r in data["rows"]
        if r["model"] == "dense" and r["task"] == "belebele" and r["metric"] == "acc"
        and r["scope"] == "overall" and r["split"] == "held_in"
    )  # fmt: skip
    csv_row = next(
        r
        for r in table
        if r["model"] == "dense" and r["task"] == "belebele" and r["metric"] == "acc"
        and r["scope"] == "overall" and r["split"] == "held_in"
    )  # fmt: skip
    assert float(csv_row["ci_low"]) == pytest.approx(overall["ci_low"])
    report = (out / "report.md").read_text()
    cell = (
        f"{overall['value']:.1f} ({overall['delta']:+.1f} "
        f"[{overall['ci_low']:.1f}, {overall['ci_high']:.1f}])"
    )
    assert overall["significant"] == (overall["ci_low"] > 0 or overall["ci_high"] < 0)
    assert (f"**{cell}**" if overall["significant"] else cell) in report
    for text in ("macro of macros", "B = 500", "seed 0", "![change_heatmap.png]", "## belebele"):
        assert text in report
    headline = report[report.index("## belebele · acc") :]
    table_line = next(line for line in headline.splitlines() if line.startswith("| dense |"))
    assert re.search(r"\d+–\d+, p=", table_line)  # sign tests in the same row
    # OUT is not replaced without --force; the same seed gives the same numbers, in one
    # process or two (each language's resamples come from its own stream).
    assert run(*args).exit_code == 2
    assert run(*args, "--jobs", 1, "--force").exit_code == 0
    assert json.loads((out / "comparison.json").read_text()) == data


@pytest.mark.slow  # four suite evals of tiny models: about two minutes on 2 busy cores
def test_three_tiny_models_eval_suite_then_compare(tmp_path, families):
    """The issue's Done-when test: base and two strategies (tiny Llamas) scored by
    `surgery eval --suite` on two families (a held-in and a held-out language each) with
    Belebele, Global-PIQA, FLORES and perplexity files written here, then `surgery compare`."""
    from sacrebleu.significance import Result, _paired_bs_test, estimate_ci

    from tests.support.suite_data import write_suite_data
    from tests.test_eval_suite import LANGS, SUITE

    write_suite_data(tmp_path / "data", LANGS, madlad="madlad/data/{lang2}")
    (tmp_path / "suite.yml").write_text(SUITE, encoding="utf-8")
    llama = families("llama")
    models = {"base": llama["base"], "trained": llama["trained"], "expert0": llama["experts"][0]}
    for name, path in models.items():
        result = run("eval", path, "--suite", tmp_path / "suite.yml", "-o", tmp_path / name, "-q")
        assert result.exit_code == 0, result.output
    base, dense, expert = (tmp_path / name for name in models)
    out = tmp_path / "report"
    result = run("compare", dense, expert, "--base", base, "-o", out, "--resamples", 2000)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "comparison.json").read_text(), parse_constant=pytest.fail)
    rows = data["rows"]

    def row(**where):
        (found,) = [r for r in rows if all(r[k] == v for k, v in where.items())]
        return found

    # The macro of macros by hand, from the per-item logs.
    for task in ("belebele", "piqa"):
        by_family = [accuracy(read_lines(dense, f"{task}/{x}")) for x in ("ces_Latn", "deu_Latn")]
        overall = row(model="trained", task=task, metric="acc", scope="overall", split="held_in")
        assert overall["value"] == pytest.approx(np.mean(by_family))
    ppl = [perplexity(read_lines(expert, f"ppl/{x}")) for x in ("szl_Latn", "ltz_Latn")]
    overall = row(model="expert0", task="ppl", metric="ppl", scope="overall", split="held_out")
    assert overall["value"] == pytest.approx(np.mean(ppl))
    # The interval of one language against a plain loop over the per-item logs.
    deltas = loop_bootstrap([base, dense], [["belebele/ces_Latn"]], accuracy, 2000, seed=1)
    lang = row(model="trained", task="belebele", metric="acc", lang="ces_Latn")
    expected = np.percentile(deltas, [2.5, 97.5])
    tolerance = 0.3 * deltas.std() + 1e-9
    assert lang["ci_low"] == pytest.approx(expected[0], abs=tolerance)
    assert lang["ci_high"] == pytest.approx(expected[1], abs=tolerance)
    # chrF: the comparison's resampled scores are sacrebleu's paired bootstrap's.
    runs = load_runs(base, [dense])
    cell = next(c for c in cells_of(runs[0].results) if c.task == "flores" and c.lang == "deu_Latn")
    _, cell_result = compute_cell(runs, cell, 500, 0)
    lines = [read_lines(folder, cell.units[0]) for folder in (base, dense)]
    refs = [[line["reference"] for line in lines[0]]]
    hyps = [[line["hypothesis"] for line in side] for side in lines]
    metric = CHRF()
    base_stats = metric._extract_corpus_statistics(hyps[0], refs)
    baseline = {"chrF2": (base_stats, Result(metric._aggregate_and_compute(base_stats).score))}
    _, sacre = _paired_bs_test(
        baseline, "trained", hyps[1], refs, {"chrF2": metric}, n_samples=500,
        seed=cell_seed(0, cell.key),
    )  # fmt: skip
    mean, half = estimate_ci(cell_result.boot["chrf"][:, 1].astype(np.float64))
    assert (mean, half) == pytest.approx((sacre["chrF2"].mean, sacre["chrF2"].ci), abs=1e-3)
    assert row(model="trained", task="flores", lang="deu_Latn")["value"] == pytest.approx(
        sacre["chrF2"].score
    )
    # Sign tests: scipy's p of the wins and losses over languages.
    for test in data["sign_tests"]:
        assert test["p"] == (
            binomtest(test["wins"], test["wins"] + test["losses"], 0.5).pvalue
            if test["wins"] + test["losses"]
            else 1.0
        )
    # Results of another suite (other shots) are refused.
    (tmp_path / "suite5.yml").write_text(SUITE.replace("shots: 1}", "shots: 2}", 1))
    other = tmp_path / "other"
    result = run("eval", llama["trained"], "--suite", tmp_path / "suite5.yml", "-o", other, "-q")
    assert result.exit_code == 0, result.output
    result = run("compare", other, "--base", base, "-o", tmp_path / "r2")
    refused(result, "suite.tasks.belebele.options.shots is 2, not 1", tmp_path / "r2")


def test_languages_in_no_family_are_their_own_mean_the_forgetting(tmp_path):
    """A suite's `others` (languages in no family): language rows with intervals under the
    split `others`, their own mean (recomputed on every resample) and sign test over them, in
    no family's mean and in no held-in or held-out macro."""
    spec = Study(families=FAMILIES, others=["eng_Latn", "fra_Latn"])
    skill = {**DENSE, "eng_Latn": -0.8, "fra_Latn": -0.4}
    folders = [
        write_results(tmp_path / name, spec, name, level, seed=seed)
        for name, level, seed in (("base", 0.0, 1), ("dense", skill, 2))
    ]
    comparison = compare(folders[0], folders[1:], resamples=200, seed=0)
    english = rows_of(comparison, lang="eng_Latn", model="dense", scope="language")
    assert len(english) >= len(spec.tasks)
    assert all(r["family"] is None and r["split"] == "others" for r in english)
    assert all(r["ci_low"] <= r["ci_high"] for r in english)
    where = dict(model="dense", task="belebele", metric="acc")
    forgot = one(comparison, scope="overall", split="others", **where)
    langs = [one(comparison, scope="language", lang=x, **where) for x in spec.others]
    assert forgot["n"] == 2 and forgot["family"] is None
    assert forgot["value"] == pytest.approx(np.mean([r["value"] for r in langs]))
    assert forgot["delta"] == pytest.approx(np.mean([r["delta"] for r in langs]))
    # The mean's resamples are the mean of its languages' (paired): a narrower interval than
    # the widest language's, but not a copy of either.
    assert forgot["ci_low"] < forgot["delta"] < forgot["ci_high"]
    assert forgot["ci_low"] not in {r["ci_low"] for r in langs}
    (test,) = [
        s for s in comparison.sign_tests
        if s["split"] == "others" and s["task"] == "belebele" and s["metric"] == "acc"
    ]  # fmt: skip
    assert (test["over"], test["wins"] + test["losses"] + test["ties"]) == ("languages", 2)
    for row in rows_of(comparison, model="dense", scope="overall"):
        assert row["n"] == (2 if row["split"] == "others" else len(FAMILIES))
    for row in rows_of(comparison, model="dense", scope="family"):
        where = {k: row[k] for k in ("task", "variant", "metric", "family", "split")}
        langs = rows_of(comparison, model="dense", scope="language", **where)
        assert row["n"] == len(FAMILIES[row["family"]][row["split"]]) == len(langs)
        assert row["value"] == pytest.approx(np.mean([r["value"] for r in langs]))
    for test in comparison.sign_tests:
        if test["over"] == "languages" and test["split"] != "others":
            langs = sum(len(f[test["split"]]) for f in FAMILIES.values())
            assert test["wins"] + test["losses"] + test["ties"] == langs
