"""Budgets that prune (`eval.search.pruning`): trials scored on a share of the search items and
cut short when a budget breaks or the frontier dominates them beyond noise (the world:
tests/support/search_world.py, with enough documents for a half's share to be judged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.search import pruning
from eval.search import storage as st
from eval.search.objectives import Budget, Measure, Objective
from eval.search.pruning import Interval, dominates, verdict
from eval.study.compare import compare_runs
from eval.study.memory import prepare_suite, score_suite, summary
from eval.study.runner import SuiteRun
from eval.study.stats import MIN_ITEMS
from tests.support import search_world

DOCS = 128  # 64 per half: a quarter (16) is too few to judge, half of it (32) is enough
BUDGET = "held_in ppl <= 6"  # BASE ~58, TRAINED ~7.1, the ideal profile ~5.9: most trials break it
SEARCH = ["--blocks", "4", "--step", "0.25", "--resamples", "200", "-q", "--budget", BUDGET]
TRIALS = 12
PPL = Measure("ppl", "ppl")
LEARNING, FORGETTING = Objective("held_in", PPL), Objective("others", PPL)


# --- the rule, on predicted values ------------------------------------------------------------


def test_dominates_needs_every_objective_as_good_and_one_better():
    lower = [False, False]
    assert dominates([1.0, 1.0], [2.0, 1.0], lower)
    assert not dominates([1.0, 1.0], [1.0, 1.0], lower)
    assert not dominates([1.0, 3.0], [2.0, 2.0], lower)
    assert dominates([3.0, 1.0], [2.0, 1.0], [True, False])


def _budget(bound: float) -> Budget:
    return Budget(LEARNING, "<=", bound, "value", f"held_in ppl <= {bound}")


BASE = {LEARNING.key: 50.0, FORGETTING.key: 40.0}


@pytest.mark.parametrize(
    ("learning", "budgets", "frontier", "expected"),
    [
        # The whole interval breaks the budget: cut by the budget.
        (Interval(8.0, 7.0, 9.0), [_budget(6.0)], [], "budget"),
        # The interval reaches into the budget: it goes on.
        (Interval(8.0, 5.5, 9.0), [_budget(6.0)], [], None),
        # Beyond the budget, but on too few items to judge: it goes on.
        (Interval(8.0, 7.0, 9.0, few=True), [_budget(6.0)], [], None),
        # A frontier point beats the interval's best corner on both objectives: dominated.
        (Interval(8.0, 7.0, 9.0), [], [[6.0, 5.0]], "dominated"),
        # The best corner beats every frontier point on learning: it goes on.
        (Interval(8.0, 5.0, 9.0), [], [[6.0, 5.0]], None),
    ],
)
def test_the_verdict(learning, budgets, frontier, expected):
    predicted = {LEARNING.key: learning, FORGETTING.key: Interval(6.0, 5.5, 6.5)}
    objectives = [LEARNING, FORGETTING]
    assert verdict(predicted, budgets, BASE, objectives, frontier) == expected


# --- shares of the search half, scored on a tiny real model -------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    return search_world.build(tmp_path_factory.mktemp("pruning_world"), docs=DOCS)


@pytest.fixture(scope="module")
def prepared(world):
    options = SuiteRun(progress=False, half="search")
    return prepare_suite(world["suite"], options, world["trained"])


def test_the_shares_cut_each_unit_s_half_into_disjoint_growing_parts(prepared):
    parts = pruning.share_parts(prepared, pruning.SHARES)
    again = pruning.share_parts(prepared, pruning.SHARES)
    for unit in prepared.units:
        half = prepared.options.items(unit, prepared.tasks[unit.id])
        pieces = [p.options.items(unit, p.tasks[unit.id]) for p in parts]
        assert [len(p) for p in pieces] == [len(half) // 4, len(half) // 4, len(half) // 2]
        assert frozenset().union(*pieces) == half and sum(map(len, pieces)) == len(half)
        assert pieces == [p.options.items(unit, p.tasks[unit.id]) for p in again]  # seeded
    assert pieces[0] != frozenset(sorted(half)[: len(half) // 4])  # shuffled, not the first


def test_only_shares_with_enough_items_in_every_unit_are_judged(prepared):
    assert pruning.judged_shares(prepared, pruning.SHARES) == (0.5, 1.0)  # 16, 32 of 64 items
    assert pruning.judged_shares(prepared, (0.25, 0.4, 1.0)) == (1.0,)  # 16, 26: scored whole


def _blender(world):
    from eval.study.memory import SuiteScorer
    from surgery.diagnostics.memory_blend import MemoryBlender
    from surgery.engine.ops.interpolate import resolve_alphas
    from surgery.hub.resolve import open_input

    def blend(profile: str):
        values, stack, modules = resolve_alphas(open_input(world["trained"]), profile, None, None)
        blender.set_alphas(values, blender.stack(stack.name) if stack else None, modules)
        return blender

    options = SuiteRun(progress=False, half="search")
    scorer = SuiteScorer(prepare_suite(world["suite"], options, world["trained"]))
    blender = MemoryBlender(world["base"], world["trained"], scorer.load)
    return blend


@pytest.fixture(scope="module")
def blend(world):
    return _blender(world)


def _whole(blend, prepared, profile: str, name: str):
    model = blend(profile)
    return score_suite(model.model, model.tokenizer, prepared, name)


def test_a_trial_scored_share_by_share_is_the_trial_scored_whole(blend, prepared):
    """The parts' lines, merged in the whole run's order, are the whole run's items, and
    their values are the whole run's (to rounding: the batches differ)."""
    profile = "0:1=1,1:2=0.5,2:3=0.75,3:4=0.25"
    whole = _whole(blend, prepared, profile, "whole")
    model = blend(profile)
    parts = [
        score_suite(model.model, model.tokenizer, part, "parts")
        for part in pruning.share_parts(prepared, pruning.SHARES)
    ]
    merged = pruning.merged(parts, "parts", whole)
    for unit_id, lines in whole.samples.items():
        assert [ln["doc_id"] for ln in merged.samples[unit_id]] == [ln["doc_id"] for ln in lines]
    ours = summary(compare_runs([merged], resamples=1), "parts")
    theirs = summary(compare_runs([whole], resamples=1), "whole")
    assert ours.keys() == theirs.keys()
    assert all(ours[k] == pytest.approx(theirs[k], rel=1e-5) for k in theirs)
    assert pruning.lines_in(merged) == pruning.lines_in(whole) == 2 * DOCS // 2


# --- a search with a budget most trials break ---------------------------------------------------


def _search(world, out: Path, *extra: str):
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    return CliRunner().invoke(cli, [*map(str, argv), *SEARCH, *extra])


def _study(out: Path):
    import optuna

    return optuna.load_study(study_name=st.STUDY, storage=st.open_storage(out, None))


@pytest.fixture(scope="module")
def pruned(world, tmp_path_factory):
    """A pruned search, with the halves of every run its pruning compared."""
    halves: list[str] = []
    original = pruning.compare_runs

    def recorded(runs, **kwargs):
        halves.extend(run.results.settings.get("half") for run in runs)
        return original(runs, **kwargs)

    pruning.compare_runs = recorded
    try:
        out = tmp_path_factory.mktemp("pruned") / "search"
        result = _search(world, out, "--trials", str(TRIALS))
    finally:
        pruning.compare_runs = original
    assert result.exit_code == 0, result.output
    return out, halves


def _frontier(out: Path) -> dict:
    return json.loads((out / "frontier.json").read_text())


@pytest.mark.slow  # a whole pruned search (about 30 s)
def test_trials_cut_short_count_toward_n_and_are_told_apart(pruned):
    out, _ = pruned
    document, study = _frontier(out), _study(out)
    counted = st.finished(study)
    cut = [t for t in counted if t.state.name == "PRUNED"]
    assert document["trials"] == len(counted) == TRIALS
    assert cut and all(t.user_attrs[st.CUT] in pruning.CUT_BY for t in cut)
    assert all(t.user_attrs[pruning.SHARE] < 1 and t.values is None for t in cut)
    assert not any(st.CUT in t.user_attrs for t in study.trials if t.state.name == "COMPLETE")
    tally = document["pruning"]
    assert tally["cut"]["budget"] == sum(t.user_attrs[st.CUT] == "budget" for t in cut)
    assert tally["cut"]["dominated"] == sum(t.user_attrs[st.CUT] == "dominated" for t in cut)
    assert tally["items_scored"] == sum(t.user_attrs[pruning.ITEMS] for t in counted)
    assert tally["items_scored"] < tally["items_unpruned"] == TRIALS * DOCS  # 2 languages
    frontier = {p["point"] for p in document["points"] if p["frontier"]}
    assert frontier and not frontier & {t.number for t in cut}
    assert "Cut short:" in (out / "report.md").read_text()


@pytest.mark.slow  # a whole pruned search (about 30 s)
def test_a_trial_cut_by_the_budget_breaks_it_on_the_whole_search_half(pruned, blend, prepared):
    """Rescored on every search item, each trial the budget cut short is outside it."""
    out, _ = pruned
    cut = [t for t in _study(out).trials if t.user_attrs.get(st.CUT) == "budget"]
    assert cut
    for trial in cut:
        run = _whole(blend, prepared, trial.user_attrs["profile"], "again")
        value = summary(compare_runs([run], resamples=1), "again")[LEARNING.key]
        assert value > 6, (trial.user_attrs["profile"], value)
        assert trial.user_attrs[pruning.ITEMS] >= 2 * MIN_ITEMS  # judged on enough items


@pytest.mark.slow  # a whole pruned search (about 30 s)
def test_pruning_never_reads_the_report_half(pruned):
    _, halves = pruned
    assert halves and set(halves) == {"search"}


@pytest.mark.slow
def test_no_prune_scores_every_trial_on_the_whole_half(world, tmp_path):
    out = tmp_path / "unpruned"
    result = _search(world, out, "--trials", "6", "--no-prune")
    assert result.exit_code == 0, result.output
    tally = _frontier(out)["pruning"]
    assert tally["cut"] == {"budget": 0, "dominated": 0}
    assert tally["items_scored"] == tally["items_unpruned"] == 6 * DOCS
    assert all(t.state.name == "COMPLETE" for t in _study(out).trials)


@pytest.mark.slow
def test_pruning_scores_fewer_items_for_the_hypervolume_of_an_unpruned_search(tmp_path):
    """The issue's check, three seeds each (bench/bench_search_pruning.py, smaller): fewer
    items per seed, and the pruned median report-half hypervolume within the unpruned seeds'
    range or above it."""
    from bench import bench_search_pruning as bench

    rows = bench.main(["--docs", str(DOCS), "--trials", "20", "--world", str(tmp_path / "w")])
    by_seed = {(row["seed"], row["mode"]): row for row in rows}
    for seed in (0, 1, 2):
        assert by_seed[seed, "pruned"]["items"] < by_seed[seed, "unpruned"]["items"]
    pruned, _, _ = bench.summary(rows, "pruned", "hypervolume")
    _, lowest, _ = bench.summary(rows, "unpruned", "hypervolume")
    assert pruned >= lowest
