"""`surgery compare`'s verdicts and headline: bootstrap p-values by hand, Benjamini-Hochberg
against scipy per cell, the minimum number of items, sign tests that cannot reach 0.05, the
forgetting-first summary with the suite's `others`, perplexity ratios and the plots' texts.

Results folders are synthetic (tests/support/study_dirs.py), as in tests/test_compare.py.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure
from matplotlib.text import Text
from scipy.stats import binomtest, false_discovery_control

from cli import cli
from eval.study.compare import cells_of, compare, compute_cell, load_runs
from eval.study.formatting import axis_label, format_change
from eval.study.report import BOLD, report_markdown, write_report
from eval.study.stats import MIN_ITEMS, bootstrap_p, smallest_sign_test_p
from tests.support.study_dirs import Study, write_results

FAMILIES = {
    "slavic": {"held_in": ["ces_Latn", "pol_Latn"], "held_out": ["hsb_Latn"]},
    "germanic": {"held_in": ["deu_Latn"], "held_out": ["ltz_Latn"]},
}
OTHERS = ["eng_Latn", "fra_Latn"]
# Learns its families' held-in languages, forgets the others.
DENSE = {"ces_Latn": 1.0, "pol_Latn": 0.8, "deu_Latn": 1.0, "eng_Latn": -0.8, "fra_Latn": -0.5}
RESAMPLES = 300


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Base, `dense` and `soup` on a suite with `others:`, compared once."""
    root = tmp_path_factory.mktemp("forgetting")
    spec = Study(families=FAMILIES, others=OTHERS)
    folders = [
        write_results(root / name, spec, name, skill, seed=seed)
        for name, skill, seed in (("base", 0.0, 1), ("dense", DENSE, 2), ("soup", 0.3, 3))
    ]
    comparison = compare(folders[0], folders[1:], resamples=RESAMPLES, seed=0)
    return SimpleNamespace(folders=folders, comparison=comparison, root=root)


def rows_of(comparison, **where):
    return [r for r in comparison.rows if all(r[k] == v for k, v in where.items())]


def one(comparison, **where):
    (row,) = rows_of(comparison, **where)
    return row


def test_bootstrap_p_is_twice_the_far_side_share_plus_one(study):
    """p = min(1, 2 (1 + min(#{d <= 0}, #{d >= 0})) / (B + 1)), by hand; and each language
    row's p is that of its cell's resampled changes."""
    changes = np.array([-1.0, 0.0, 0.5, 1, 2, 3, 4, 5, 6, 7])  # 2 at or below 0, 9 at or above
    assert bootstrap_p(changes) == pytest.approx(2 * 3 / 11)
    assert bootstrap_p(-changes) == pytest.approx(2 * 3 / 11)
    assert bootstrap_p(np.zeros(50)) == 1.0  # no change at all: 0 on both sides
    assert bootstrap_p(np.arange(1.0, 1000.0)) == pytest.approx(2 / 1000)  # never 0
    runs = load_runs(study.folders[0], study.folders[1:])
    cell = next(c for c in cells_of(runs[0].results) if c.key == "belebele|None|hsb_Latn")
    _, result = compute_cell(runs, cell, RESAMPLES, 0)
    boot = result.boot["acc"].astype(np.float64)
    for m, model in ((1, "dense"), (2, "soup")):
        d = boot[:, m] - boot[:, 0]
        far = min(int((d <= 0).sum()), int((d >= 0).sum()))
        row = one(study.comparison, model=model, task="belebele", lang="hsb_Latn", metric="acc")
        assert row["p"] == pytest.approx(min(1.0, 2 * (1 + far) / (RESAMPLES + 1)))


def test_benjamini_hochberg_over_each_table_is_scipys(study):
    """Per metric and table (headline: overall, others and family means; per language; per
    task) the strategies' q are scipy's false_discovery_control of their p, cell by cell, and
    the adjusted verdict is the unadjusted one with q < 0.05 on enough items."""
    tables = {}
    for row in study.comparison.rows:
        if row["model"] == "base":
            assert row["p"] is None and row["q"] is None
            continue
        table = "headline" if row["scope"] in ("overall", "family") else row["scope"]
        tables.setdefault((row["task"], row["variant"], row["metric"], table), []).append(row)
    sizes = set()
    for rows in tables.values():
        expected = false_discovery_control([r["p"] for r in rows], method="bh")
        for row, q in zip(rows, expected, strict=True):
            assert row["q"] == pytest.approx(q, rel=1e-12)
            expected = row["significant"] and q < 0.05 and not row["few_items"]
            assert row["significant_adjusted"] == expected
        sizes.add(len(rows))
    # Headline: 2 strategies x (in, out, others + 2 families x 2); language: 2 x 7 languages.
    assert sizes == {14} and len(tables) > 10
    moved = [r for r in study.comparison.rows if r["significant"]]
    assert any(r["significant_adjusted"] for r in moved)


def test_a_cell_on_fewer_than_min_items_is_marked_and_never_bold(tmp_path):
    """29 items: the interval excludes 0 and yet the cell is marked ‡ and not bold, and so is
    every mean resting on it; 30 items: bold."""
    assert MIN_ITEMS == 30
    tasks = {
        "belebele": {"kind": "belebele", "path": "b/{lang}.jsonl", "n": MIN_ITEMS - 1},
        "piqa": {"kind": "piqa", "path": "p/{lang}.jsonl", "n": MIN_ITEMS},
    }
    spec = Study(families={"f": {"held_in": ["ces_Latn"], "held_out": []}}, tasks=tasks)
    base = write_results(tmp_path / "base", spec, "base", 0.0, seed=1)
    strong = write_results(tmp_path / "strong", spec, "strong", 1.5, seed=2)
    out = tmp_path / "report"
    assert (
        run("compare", strong, "--base", base, "-o", out, "--resamples", 500, "-q").exit_code == 0
    )
    comparison = compare(base, [strong], resamples=500, seed=0)
    report = (out / "report.md").read_text()
    for task, few in (("belebele", True), ("piqa", False)):
        rows = rows_of(comparison, model="strong", task=task, metric="acc")
        assert {r["scope"] for r in rows} == {"language", "family", "overall"}
        for row in rows:
            assert row["ci_low"] > 0  # the interval alone would call it
            assert row["items"] == tasks[task]["n"] and row["few_items"] is few
            assert row["significant"]  # the interval's verdict alone
        cell = (
            f"{row['value']:.1f} ({row['delta']:+.1f} [{row['ci_low']:.1f}, {row['ci_high']:.1f}])"
        )
        assert (f"{cell}‡" if few else f"**{cell}**") in report
    assert f"fewer than {MIN_ITEMS} items" in report


def test_sign_tests_that_cannot_reach_five_percent_say_so(study):
    """The smallest two-sided p over k units is scipy's binomtest of k wins in k (0.0625 for
    five families); under a table whose sign tests cannot reach 0.05, a line says so."""
    for k in range(1, 9):
        assert smallest_sign_test_p(k) == pytest.approx(binomtest(k, k, 0.5).pvalue)
    assert smallest_sign_test_p(5) == 0.0625
    report = report_markdown(study.comparison, [])
    table = report[report.index("## ppl, lower is better") :]
    note = next(line for line in table.splitlines() if line.startswith("Sign tests over"))
    assert "can never reach p < 0.05" in note
    assert "0.5 over 2 families" in note and "0.25 over 3 languages" in note


def test_the_report_opens_with_forgetting_learning_and_transfer(study, tmp_path):
    """The first section: per strategy and metric, the change (and interval) on the `others`
    languages, the held-in and the held-out ones; headline tables and the heatmap have an
    `others` column."""
    report = report_markdown(study.comparison, [])
    sections = re.findall(r"^## .*$", report, flags=re.M)
    assert sections[0] == "## What each strategy forgot, learned and transferred"
    summary = report[: report.index(sections[1])]
    header = "| strategy | metric | forgotten elsewhere (others) | learned (held-in) | "
    assert header + "transferred (held-out) |" in summary
    assert "(eng_Latn, fra_Latn)" in summary
    for model in ("dense", "soup"):
        where = dict(model=model, task="ppl", metric="ppl", scope="overall")
        cells = [
            format_change(one(study.comparison, split=s, **where), 2)
            for s in ("others", "held_in", "held_out")
        ]
        assert f"| {model} | ppl (lower is better) | {' | '.join(cells)} |" in summary
    # dense forgets the others (ppl up) and learns held-in (ppl down).
    where = dict(model="dense", task="ppl", metric="ppl", scope="overall")
    forgot = one(study.comparison, split="others", **where)
    learned = one(study.comparison, split="held_in", **where)
    assert forgot["ci_low"] > 0 > learned["ci_high"]
    assert "| strategy | all in | all out | others | slavic in |" in report
    # Without `others:`, the summary says that forgetting elsewhere is not measured.
    spec = Study(families=FAMILIES)
    folders = [write_results(tmp_path / n, spec, n, s, seed=i) for i, (n, s) in enumerate(
        (("base", 0.0), ("dense", DENSE)))]  # fmt: skip
    plain = report_markdown(compare(folders[0], folders[1:], resamples=50), [])
    assert "The suite has no `others:` languages" in plain
    assert "forgotten elsewhere" not in plain


def test_perplexity_changes_are_also_ratios_to_the_base(study):
    """ppl rows carry value / base value and the percentiles of the resampled ratios;
    accuracies carry none."""
    runs = load_runs(study.folders[0], study.folders[1:])
    cell = next(c for c in cells_of(runs[0].results) if c.key == "ppl|None|eng_Latn")
    _, result = compute_cell(runs, cell, RESAMPLES, 0)
    boot = result.boot["ppl"].astype(np.float64)
    base = one(study.comparison, model="base", task="ppl", metric="ppl", lang="eng_Latn")
    row = one(study.comparison, model="dense", task="ppl", metric="ppl", lang="eng_Latn")
    assert row["ratio"] == pytest.approx(row["value"] / base["value"])
    expected = np.percentile(boot[:, 1] / boot[:, 0], [2.5, 97.5])
    assert (row["ratio_low"], row["ratio_high"]) == pytest.approx(tuple(expected))
    assert base["ratio"] is None
    assert (
        one(study.comparison, model="dense", task="belebele", metric="acc", lang="eng_Latn")[
            "ratio"
        ]
        is None
    )


def _texts(monkeypatch) -> dict[str, list[str]]:
    """Every text of every figure saved, by file name."""
    saved: dict[str, list[str]] = {}
    original = Figure.savefig

    def savefig(fig, path, *args, **kwargs):
        saved[path.name] = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
        return original(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def test_plots_draw_forgetting_and_say_what_they_draw(study, tmp_path, monkeypatch):
    """With `others`: the trade-off plot draws them against held-in learning and its title
    says so; perplexity as a ratio to the base; no `{lang}` placeholder in any text."""
    texts = _texts(monkeypatch)
    (tmp_path / "r").mkdir()
    assert write_report(study.comparison, tmp_path / "r") == []
    assert sorted(texts) == ["change_heatmap.png", "tradeoff.png"]
    tradeoff = texts["tradeoff.png"]
    assert "Forgetting (others) against learning (held-in), 95% intervals" in tradeoff
    assert "held-in ppl: ratio to the base (lower is better)" in tradeoff
    assert "others belebele · acc: change from the base (higher is better)" in tradeoff
    heatmap = texts["change_heatmap.png"]
    assert "ppl: ratio to base (lower is better)" in heatmap and "others" in heatmap
    assert any(re.fullmatch(r"[01]\.\d+‡?", t) for t in heatmap)
    everything = [t for saved in texts.values() for t in saved]
    assert not [t for t in everything if "{" in t or "}" in t]
    assert "flores eng_Latn→each language · chrf: change from base (higher is better)" in heatmap
    axis = {"task": "flores", "variant": "{lang}-eng_Latn", "metric": "chrf"}
    assert axis_label(axis) == "flores each language→eng_Latn · chrf"


def test_a_plot_that_cannot_be_drawn_says_why(tmp_path, monkeypatch):
    """No held-out and no `others` languages: transfer or forgetting cannot be drawn, and
    the report and the command say why; with held-out but no `others`, the plot is titled
    transfer, not forgetting."""
    texts = _texts(monkeypatch)
    tasks = {"ppl": {"kind": "ppl", "path": "m/{lang2}/", "n": 30}}
    spec = Study(families={"f": {"held_in": ["ces_Latn"], "held_out": []}}, tasks=tasks)
    base = write_results(tmp_path / "base", spec, "base", 0.0, seed=1)
    other = write_results(tmp_path / "other", spec, "other", 0.5, seed=2)
    args = ("compare", other, "--base", base, "-o", tmp_path / "r", "--resamples", 50)
    result = run(*args, "--bold", "adjusted")
    assert result.exit_code == 0, result.output
    assert '"bold": "adjusted"' in (tmp_path / "r/comparison.json").read_text()
    why = "No trade-off plot: it needs a metric measured on held-in languages and on " + (
        "`others:` or held-out ones, and this suite has neither `others:` nor held-out languages."
    )
    assert why in result.stderr and why in (tmp_path / "r/report.md").read_text()
    assert sorted(p.name for p in (tmp_path / "r").glob("*.png")) == ["change_heatmap.png"]
    spec = Study(families=FAMILIES, tasks=tasks)
    base = write_results(tmp_path / "base2", spec, "base", 0.0, seed=1)
    other = write_results(tmp_path / "other2", spec, "other", 0.5, seed=2)
    (tmp_path / "r2").mkdir()
    write_report(compare(base, [other], resamples=50), tmp_path / "r2")
    assert "Transfer (held-out) against learning (held-in), 95% intervals" in texts["tradeoff.png"]


def test_bold_adjusted_bolds_only_what_survives_benjamini_hochberg(study):
    """`--bold adjusted`: a headline cell is bold exactly where its change survives BH;
    by default, where its unadjusted interval excludes 0 (on enough items); † either way."""
    for bold, key in (("adjusted", "significant_adjusted"), ("interval", "significant")):
        report = report_markdown(study.comparison, [], [], BOLD[bold])
        rows = rows_of(study.comparison, task="belebele", metric="acc", scope="overall")
        for row in (r for r in rows if r["model"] != "base"):
            cell = (
                f"{row['value']:.1f} ({row['delta']:+.1f} "
                f"[{row['ci_low']:.1f}, {row['ci_high']:.1f}])"
            )
            assert (f"**{cell}**" in report) is row[key], (bold, row)
            assert (f"{cell}†" in report or f"{cell}**†" in report) is row["significant_adjusted"]
    assert any(r["significant"] and not r["significant_adjusted"] for r in study.comparison.rows)


def test_tradeoff_puts_forgetting_on_x_and_heatmap_panels_share_their_columns(study):
    """As in search's frontier: forgetting (`others`) on x, learning (held-in) on y. Every
    heatmap panel has the same columns at the same place (a metric without a column's mean
    leaves its cell blank); cells within noise are NaN (drawn grey and hatched), not coloured."""
    from eval.study.plots import heatmap_figure, tradeoff_figure
    from surgery.plotting import close

    fig = tradeoff_figure(study.comparison)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("others ") and ax.get_ylabel().startswith("held-in ")
    close(fig)
    fig = heatmap_figure(study.comparison)
    panels = [ax for ax in fig.axes if ax.images and ax.get_yticklabels()]
    columns = {tuple(t.get_text() for t in ax.get_xticklabels()) for ax in panels}
    assert len(panels) > 1 and len(columns) == 1 and "others" in next(iter(columns))
    assert len({tuple(ax.get_position().intervalx) for ax in panels}) == 1
    noise = [r for r in study.comparison.rows if r["model"] != "base" and not r["significant"]]
    assert noise and any(np.isnan(ax.images[0].get_array().filled(np.nan)).any() for ax in panels)
    close(fig)
