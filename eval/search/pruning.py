"""Budgets that prune: a trial that is already out of the running on a share of the search half
stops there.

A sampled trial is scored on a first share of every unit's search items (`SHARES`: a quarter,
then half, then all of them; each share adds the next items of a seeded order, so no item is
scored twice). After each share but the last, its change from BASE on the same items, with the
paired bootstrap interval `surgery compare` gives it, predicts its value on the whole search
half: BASE's whole-half value moved by the change (scaled by the ratio for perplexities). The
interval's half-widths shrink by sqrt(1 - share), the finite-population correction: the items
scored are part of the half the prediction is about. The trial is cut short when the prediction
is out of the running beyond that noise (never on a change resting on fewer items in some
language than `surgery compare` calls a change on, `eval.study.stats.MIN_ITEMS`: a share with
fewer in some unit is skipped, and a half with fewer than twice as many is scored whole):

- **budget**: even the end of the interval most favourable to a `--budget` breaks it;
- **dominated**: a point of the current frontier (optuna's Pareto front of the complete trials
  within the budgets, on the whole search half) is at least as good on every objective as the
  interval's most favourable corner, and better on one.

Otherwise the trial goes on to the next share and, at the last, is a complete trial scored on
every search item. A cut trial is PRUNED in optuna's storage with the user attribute `cut`
(`budget` or `dominated`), the share it was cut at, its predicted values and the items scored;
its predicted budget violations are its constraints, so the sampler learns from it. It counts
toward N (`eval.search.storage.finished`); trials past N, which the search also prunes, carry no
`cut`. The baselines are never cut, and the report half is never read here.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from eval.search import storage as st
from eval.study.compare import Comparison, Run, compare_runs
from eval.study.halves import unit_key
from eval.study.memory import PreparedSuite, axis_name, score_suite
from eval.study.runner import SuiteRun
from eval.study.stats import MIN_ITEMS
from eval.study.suite import Unit
from eval.tasks import Task

SHARES = (0.25, 0.5, 1.0)  # successive halving over the search items: each share doubles
CUT_BY = ("budget", "dominated")  # the values of a cut trial's `cut` attribute
SHARE = "share"  # a cut trial's user attribute: the share of the search items it was scored on
ESTIMATE = "estimate"  # a cut trial's user attribute: its predicted whole-half values
ITEMS = "items"  # every counted trial's user attribute: the search items scored for it


@dataclass(frozen=True)
class PartRun(SuiteRun):
    """The suite's run settings scoring only some items of each unit (a part of its half)."""

    part: dict[str, frozenset[int]] = field(default_factory=dict, compare=False)

    def items(self, unit: Unit, task: Task) -> frozenset[int] | None:
        """The unit's items in this part."""
        return self.part[unit.id]


def share_parts(prepared: PreparedSuite, shares: tuple[float, ...]) -> list[PreparedSuite]:
    """The items each share adds, as suites to score: each unit's half in an order seeded by
    the split seed and the unit (few-shot copies of a unit share it), cut at every share (at
    least one item in the first, so every unit is in it)."""
    options = prepared.options
    cuts = {}
    for unit in prepared.units:
        order = sorted(options.items(unit, prepared.tasks[unit.id]) or ())
        random.Random(f"shares/{options.split_seed}/{unit_key(unit.id)}").shuffle(order)
        ends = [max(1, math.ceil(share * len(order))) for share in shares]
        cuts[unit.id] = [frozenset(order[a:b]) for a, b in zip([0, *ends], ends, strict=False)]
    settings = {f.name: getattr(options, f.name) for f in fields(SuiteRun)}
    parts = []
    for index in range(len(shares)):
        part = {unit_id: c[index] for unit_id, c in cuts.items() if c[index]}
        units = [u for u in prepared.units if u.id in part]
        parts.append(replace(prepared, units=units, options=PartRun(**settings, part=part)))
    return parts


def judged_shares(prepared: PreparedSuite, shares: tuple[float, ...]) -> tuple[float, ...]:
    """The shares at which every unit has `MIN_ITEMS` items or more (a change on fewer is not
    judged), then the whole half; (1.0,) alone: every trial is scored whole, as unpruned."""
    counts = [
        len(prepared.options.items(unit, prepared.tasks[unit.id]) or ()) for unit in prepared.units
    ]
    judged = [s for s in shares[:-1] if min(math.ceil(s * n) for n in counts) >= MIN_ITEMS]
    return (*judged, 1.0)


def lines_in(run: Run) -> int:
    """The items a run scored (its samples lines)."""
    assert run.samples is not None
    return sum(len(lines) for lines in run.samples.values())


def merged(parts: list[Run], name: str, order: Run) -> Run:
    """The parts' runs as one (the first holds every unit), each unit's lines in `order`'s
    item order (BASE's run on the whole half: the order a whole-half run scores them in)."""
    rank = {
        unit_id: {str(line["doc_id"]): i for i, line in enumerate(lines)}
        for unit_id, lines in (order.samples or {}).items()
    }
    samples = {}
    for unit in parts[0].results.units:
        lines = [line for run in parts for line in (run.samples or {}).get(unit.id, ())]
        samples[unit.id] = sorted(lines, key=lambda line: rank[unit.id][str(line["doc_id"])])
    return Run(Path(name), parts[0].results, name, samples)


def restricted(run: Run, to: Run) -> Run:
    """`run` (BASE on the whole half) on the items of `to` alone: the pair `compare` needs."""
    assert run.samples is not None and to.samples is not None
    samples = {}
    for unit_id, lines in run.samples.items():
        wanted = {str(line["doc_id"]) for line in to.samples[unit_id]}
        samples[unit_id] = [line for line in lines if str(line["doc_id"]) in wanted]
    return Run(run.folder, run.results, run.name, samples)


@dataclass(frozen=True)
class Interval:
    """A predicted whole-half value and the ends of its noise; `few`: some language it averages
    has fewer items than `surgery compare` calls a change on (`eval.study.stats.MIN_ITEMS`)."""

    value: float
    low: float
    high: float
    few: bool = False


def predictions(
    comparison: Comparison, model: str, base: dict[tuple, float], share: float
) -> dict[tuple, Interval]:
    """Per measured key in `base` (BASE's whole-half values), `model`'s predicted whole-half
    value: BASE's moved by the change on the share's items (by the ratio for perplexities), the
    change's 95% interval narrowed by sqrt(1 - share)."""
    shrink = math.sqrt(max(0.0, 1.0 - share))
    found = {}
    for row in comparison.rows:
        key = (axis_name(row), row["metric"], row["split"])
        if row["model"] != model or row["scope"] not in ("overall", "task") or key not in base:
            continue
        value, few = base[key], row["few_items"]
        if row.get("ratio") is not None:
            ratio, low, high = row["ratio"], row["ratio_low"], row["ratio_high"]
            ends = (ratio - shrink * (ratio - low), ratio + shrink * (high - ratio))
            found[key] = Interval(value * ratio, value * ends[0], value * ends[1], few)
        else:
            delta, low, high = row["delta"], row["ci_low"], row["ci_high"]
            ends = (delta - shrink * (delta - low), delta + shrink * (high - delta))
            found[key] = Interval(value + delta, value + ends[0], value + ends[1], few)
    return found


def verdict(
    predicted: dict[tuple, Interval],
    budgets: list[Any],
    base: dict[tuple, float],
    objectives: list[Any],
    frontier: list[list[float]],
) -> str | None:
    """`budget`, `dominated` (see the module docstring), or None: the trial goes on.

    Args:
        predicted: the trial's predicted whole-half values, per measured key.
        budgets: the search's budgets (`eval.search.objectives.Budget`).
        base: BASE's whole-half values, per measured key.
        objectives: the optimized objectives, in the order of the frontier's values.
        frontier: the values of the frontier's trials.
    """
    for budget in budgets:
        key = budget.objective.key
        interval = predicted[key]
        ends = (interval.low, interval.high)
        if not interval.few and min(budget.violation(end, base[key]) for end in ends) > 0:
            return "budget"
    if any(predicted[o.key].few for o in objectives):
        return None
    best = [predicted[o.key].high if o.measure.higher else predicted[o.key].low for o in objectives]
    higher = [o.measure.higher for o in objectives]
    if any(dominates(point, best, higher) for point in frontier):
        return "dominated"
    return None


def dominates(a: list[float], b: list[float], higher: list[bool]) -> bool:
    """Whether `a` is at least as good as `b` on every objective and better on one."""
    signs = [1.0 if h else -1.0 for h in higher]
    gains = [s * (x - y) for s, x, y in zip(signs, a, b, strict=True)]
    return all(g >= 0 for g in gains) and any(g > 0 for g in gains)


class Pruner:
    """Scores a searcher's trials share by share, and cuts those out of the running."""

    def __init__(self, searcher: Any, base: Run, shares: tuple[float, ...] = SHARES) -> None:
        """`base`: BASE scored on the whole search half (`searcher.base_values` its values);
        `shares`: (1.0,) scores every trial on the whole half at once (`--no-prune`)."""
        self.searcher = searcher
        self.base = base
        self.half_items = lines_in(base)
        prepared = searcher.checked.search
        shares = judged_shares(prepared, shares)
        self.parts = share_parts(prepared, shares) if len(shares) > 1 else []

    def values(self, trial: Any, profile: str) -> dict[tuple, float]:
        """The trial's measured values on the whole search half.

        Raises:
            optuna.TrialPruned: the trial was cut short (its attributes say why).
        """
        searcher, name = self.searcher, f"trial-{trial.number}"
        if not self.parts or trial.user_attrs.get("baseline") is not None:
            trial.set_user_attr(ITEMS, self.half_items)
            return searcher.values(profile, searcher.checked.search, name)
        searcher.blend(profile)
        model, tokenizer = searcher.blender.model, searcher.blender.tokenizer
        runs: list[Run] = []
        for index, part in enumerate(self.parts):
            if part.units:  # a later share of units with few items may add none
                runs.append(score_suite(model, tokenizer, part, name))
            run = merged(runs, name, self.base)
            if index == len(self.parts) - 1:
                trial.set_user_attr(ITEMS, lines_in(run))
                return searcher.measure(run)
            self._check(trial, profile, run)
        raise AssertionError("unreachable: the last share returns")

    def _check(self, trial: Any, profile: str, run: Run) -> None:
        """Cut the trial short if its scores on the items so far put it out of the running."""
        import optuna

        searcher = self.searcher
        checked, options = searcher.checked, searcher.options
        scored = lines_in(run)
        comparison = compare_runs(
            [restricted(self.base, run), run], resamples=options.resamples, seed=options.seed
        )
        base = searcher.base_values
        predicted = predictions(comparison, run.name, base, scored / self.half_items)
        frontier = [list(t.values) for t in searcher.study.best_trials]
        cut = verdict(predicted, checked.budgets, base, checked.objectives, frontier)
        if cut is None:
            return
        trial.set_user_attr("profile", profile)
        trial.set_user_attr(st.CUT, cut)
        trial.set_user_attr(SHARE, round(scored / self.half_items, 4))
        trial.set_user_attr(ITEMS, scored)
        trial.set_user_attr(ESTIMATE, [predicted[o.key].value for o in checked.measured])
        for index, budget in enumerate(checked.budgets):
            key = budget.objective.key
            trial.set_constraint(
                f"budget {index}", budget.violation(predicted[key].value, base[key])
            )
        raise optuna.TrialPruned(f"cut short: {cut}")


def tally(study: Any, half_items: int) -> dict[str, Any]:
    """How many counted trials were cut short (by a budget, by dominance), and the search items
    scored for them all against what scoring each on the whole half would take."""
    trials = st.finished(study)
    cut = [t.user_attrs.get(st.CUT) for t in trials]
    scored = sum(t.user_attrs.get(ITEMS, half_items) for t in trials)
    return {
        "trials": len(trials),
        "cut": {reason: cut.count(reason) for reason in CUT_BY},
        "items_scored": scored,
        "items_unpruned": half_items * len(trials),
    }
