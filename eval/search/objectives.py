"""What `surgery search` optimizes and what it must respect, read from the suite.

A measure is one task's metric (`--measure TASK[/METRIC]`; by default the suite's perplexity
task and its primary metric). Over a split of the suite's languages it is an objective:
learning (held in), transfer (held out) and forgetting (the suite's `others:`), each averaged as
`surgery compare` averages it (the mean over families of the family means; the mean over the
`others` languages). Budgets bound any split and measure:

    others ppl <= +5%       change relative to BASE's value
    held_in chrf >= +2      absolute change from BASE's value
    held_in ppl <= 30       a value

Everything here is checked against the suite before any model loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eval.errors import SuiteError
from eval.study.suite import Suite, plan
from eval.tasks import KINDS

# Objective names and the suite split each averages over.
SPLITS = {
    "learning": "held_in",
    "held_in": "held_in",
    "transfer": "held_out",
    "held_out": "held_out",
    "forgetting": "others",
    "others": "others",
}
ROLES = {"held_in": "learning", "held_out": "transfer", "others": "forgetting"}
# The metrics of each kind's per-item measure (`eval.study.measures`), the primary first.
METRICS = {
    "perplexity": ("ppl", "word_perplexity", "byte_perplexity", "bits_per_byte"),
    "outcomes": ("acc", "acc_norm", "acc_bytes"),
    "chrf": ("chrf", "chrf++"),
}
LOWER_IS_BETTER = {"ppl", "word_perplexity", "byte_perplexity", "bits_per_byte"}


@dataclass(frozen=True)
class Measure:
    """One metric of one task (a flores direction is a task of its own: `flores[SRC-TGT]`)."""

    task: str
    metric: str

    @property
    def higher(self) -> bool:
        """Whether a higher value is better."""
        return self.metric not in LOWER_IS_BETTER

    def __str__(self) -> str:
        return f"{self.task}/{self.metric}"


@dataclass(frozen=True)
class Objective:
    """A measure averaged over one split: held_in, held_out or others."""

    split: str
    measure: Measure

    @property
    def key(self) -> tuple[str, str, str]:
        """(task, metric, split), as `eval.study.memory.summary` keys values."""
        return (self.measure.task, self.measure.metric, self.split)

    @property
    def name(self) -> str:
        """`learning ppl/ppl`: its role and measure, as frontier.json and report.md name it."""
        return f"{ROLES[self.split]} {self.measure}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Budget:
    """A bound on an objective: a value, a change from BASE, or a change relative to BASE."""

    objective: Objective
    op: str  # "<=" or ">="
    bound: float
    mode: str  # "value", "change" or "relative"
    text: str

    def limit(self, base: float) -> float:
        """The bound as a value, given BASE's value."""
        if self.mode == "change":
            return base + self.bound
        if self.mode == "relative":
            return base * (1 + self.bound / 100)
        return self.bound

    def violation(self, value: float, base: float) -> float:
        """How far `value` lies outside the budget: <= 0 within it (optuna's constraint)."""
        gap = value - self.limit(base)
        return gap if self.op == "<=" else -gap


class Measures:
    """The measures a suite offers: each task's metrics and the splits it has languages in."""

    def __init__(self, suite: Suite) -> None:
        self.suite = suite
        self.tasks: dict[str, str] = {}  # measure task name -> kind
        self.primary: dict[str, str] = {}
        self.per_language: set[str] = set()
        self.by_key: dict[str, list[str]] = {}  # suite task key -> its measure task names
        for unit in plan(suite):
            name = unit.task if unit.variant is None else f"{unit.task}[{unit.variant}]"
            if name in self.tasks:
                continue
            self.tasks[name] = unit.kind
            self.by_key.setdefault(unit.task, []).append(name)
            chosen = unit.spec.options.get("metric")  # flores: chrf or chrf++
            self.primary[name] = chosen or KINDS[unit.kind].primary or METRICS[_kind(unit.kind)][0]
            if unit.lang is not None:
                self.per_language.add(name)

    def splits(self) -> set[str]:
        """The splits that hold languages."""
        found = set()
        for family in self.suite.families:
            if family.held_in:
                found.add("held_in")
            if family.held_out:
                found.add("held_out")
        if self.suite.others:
            found.add("others")
        return found

    def default(self) -> Measure:
        """The suite's perplexity task and its primary metric (the first, if several).

        Raises:
            SuiteError: the suite has no perplexity task.
        """
        for name, kind in self.tasks.items():
            if KINDS[kind].measure == "perplexity":
                return Measure(name, self.primary[name])
        raise SuiteError("the suite has no perplexity task; name a measure with --measure")

    def measure(self, text: str) -> Measure:
        """`TASK` (its primary metric), `TASK/METRIC`, or a metric of exactly one task.

        Raises:
            SuiteError: no such task or metric in the suite, or an ambiguous name.
        """
        task, _, metric = text.strip().partition("/")
        names = self.by_key.get(task, [task] if task in self.tasks else [])
        if not names:  # a metric's name alone: the one task that has it
            names = [n for n in self.tasks if task in METRICS[_kind(self.tasks[n])]]
            if len(names) == 1 and not metric:
                return Measure(names[0], task)
            raise SuiteError(
                f"measure {text!r}: the suite has no such task"
                + (f" (it has {', '.join(self.tasks)})" if not names else "; name the task")
            )
        if len(names) > 1:
            raise SuiteError(
                f"measure {text!r}: task {task} has several directions; name one of "
                + ", ".join(names)
            )
        name = names[0]
        allowed = METRICS[_kind(self.tasks[name])]
        metric = metric or self.primary[name]
        if metric not in allowed:
            raise SuiteError(
                f"measure {text!r}: {name} has no metric {metric} ({', '.join(allowed)})"
            )
        return Measure(name, metric)

    def objective(self, split: str, measure: Measure) -> Objective:
        """`measure` over `split` (an objective name or a split name).

        Raises:
            SuiteError: an unknown split, one the suite has no language in, or a measure of a
                task without languages.
        """
        if split not in SPLITS:
            raise SuiteError(f"objective {split!r}: use {', '.join(SPLITS)}")
        split = SPLITS[split]
        if split not in self.splits():
            hint = " (add others: [LANG, ...], languages in no family)" if split == "others" else ""
            raise SuiteError(f"{ROLES[split]} needs {split} languages and the suite has none{hint}")
        if measure.task not in self.per_language:
            raise SuiteError(f"measure {measure}: task {measure.task} has no languages to average")
        return Objective(split, measure)


def _kind(kind: str) -> str:
    return KINDS[kind].measure


def parse_objectives(measures: Measures, measure: str | None, extra: str | None) -> list[Objective]:
    """Learning and forgetting of `measure` (default: the suite's perplexity task), then each
    of `extra`: comma-separated `SPLIT [MEASURE]` (the measure defaults to `measure`).

    Raises:
        SuiteError: a bad split or measure, or one objective given twice.
    """
    main = measures.measure(measure) if measure else measures.default()
    objectives = [measures.objective("learning", main), measures.objective("forgetting", main)]
    for item in filter(None, (part.strip() for part in (extra or "").split(","))):
        split, _, name = item.partition(" ")
        chosen = measures.measure(name) if name.strip() else main
        objective = measures.objective(split, chosen)
        if objective in objectives:
            raise SuiteError(f"--objectives {item!r}: {objective} is already an objective")
        objectives.append(objective)
    return objectives


_BUDGET_RE = re.compile(
    r"^\s*(?P<split>\w+)\s+(?P<measure>\S+)\s*(?P<op><=|>=)\s*"
    r"(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<percent>%?)\s*$"
)


def parse_budget(measures: Measures, text: str) -> Budget:
    """`SPLIT MEASURE <=|>= VALUE`: `others ppl <= +5%` (relative change), `held_in chrf >= +2`
    (change), `held_in ppl <= 30` (a value).

    Raises:
        SuiteError: bad grammar, or a split or measure the suite does not have.
    """
    match = _BUDGET_RE.match(text)
    if match is None:
        raise SuiteError(
            f"budget {text!r}: write SPLIT MEASURE <= VALUE, e.g. 'others ppl <= +5%' "
            "(a change relative to BASE), 'held_in chrf >= +2' (a change), 'held_in ppl <= 30'"
        )
    sign, percent = match["sign"], match["percent"]
    if percent and not sign:
        raise SuiteError(f"budget {text!r}: a percentage is a change from BASE; write +5% or -5%")
    bound = float(match["number"]) * (-1 if sign == "-" else 1)
    mode = "relative" if percent else "change" if sign else "value"
    objective = measures.objective(match["split"], measures.measure(match["measure"]))
    return Budget(objective, match["op"], bound, mode, text.strip())
