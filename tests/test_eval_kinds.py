"""Task kinds: one module each, asked by the suite, the runner and compare (no name branches)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import eval.kinds
from eval.kinds import KINDS, Kind, Option
from eval.kinds.base import Expansion, count
from eval.study import measures, runner
from eval.study.results import UnitResult
from eval.study.suite import load_suite, plan
from eval.tasks import kinds_help, load_task

SUITE = """
families:
  f: {held_in: [ces_Latn], held_out: [pol_Latn]}
tasks:
  twice: {path: "data/{lang}.txt", reps: 2}
"""


class _Twice(Kind):
    """A kind made up for the test: one unit per repetition, files per language."""

    def suite_entry(self, entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return entry.pop("path", None), {"reps": entry.pop("reps", 1)}

    def expand(self, options, lang_vars, extras) -> list[Expansion]:
        return [(f"rep{i}", f"rep{i}", {**options, "rep": str(i)}) for i in range(extras["reps"])]

    def metric_prefix(self, task: str, lang: str | None) -> str:
        return f"{task}/{lang}/twice/"


class _ToyTask:
    def __init__(self, spec) -> None:
        self.spec = spec


def _register_twice(monkeypatch) -> Kind:
    kind = _Twice(
        "twice",
        "FILE",
        "a made-up kind",
        {"rep": Option(count(0), 0, "repetition")},
        loader=_ToyTask,
        measure="perplexity",
        primary="bits_per_byte",
    )
    monkeypatch.setitem(KINDS, "twice", kind)
    return kind


def test_each_kind_is_registered_by_its_module_named_after_it():
    found = {}
    for info in pkgutil.iter_modules(eval.kinds.__path__):
        module = importlib.import_module(f"eval.kinds.{info.name}")
        if hasattr(module, "KIND"):  # the others are shared by several kinds
            assert module.KIND.name.replace("-", "_") == info.name
            found[module.KIND.name] = module.KIND
    assert found == KINDS
    # Registered where defined: the loader is the kind module's own.
    for name, kind in KINDS.items():
        assert kind.loader.__module__ == f"eval.kinds.{name.replace('-', '_')}", name


def test_kinds_are_sorted_by_name_in_help_and_docs():
    assert list(KINDS) == sorted(KINDS)
    help_order = [line.split(":")[0].strip() for line in kinds_help().splitlines()]
    assert [name for name in help_order if name in KINDS] == sorted(KINDS)


def test_a_kind_defined_in_one_place_runs_through_suite_runner_and_compare(tmp_path, monkeypatch):
    _register_twice(monkeypatch)
    (tmp_path / "suite.yml").write_text(SUITE, encoding="utf-8")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ces_Latn.txt").write_text("x\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    units = plan(load_suite(tmp_path / "suite.yml"))
    assert [u.id for u in units] == [
        "twice/ces_Latn/rep0",
        "twice/ces_Latn/rep1",
        "twice/pol_Latn/rep0",
        "twice/pol_Latn/rep1",
    ]
    assert [u.spec.options["rep"] for u in units] == [0, 1, 0, 1]
    missing = "data/pol_Latn.txt"
    assert [runner.missing_path(u) for u in units] == [None, None, missing, missing]
    assert runner.unit_metrics(units[0], {"twice/ces_Latn/twice/ppl": 3.0}) == {"ppl": 3.0}
    result = UnitResult("u", "twice", "twice", None, None, None, None, None, {}, "s", None)
    measure = measures.measure_for("twice", result, {})
    assert set(measure.metrics) == set(measures.PPL_METRICS)
    assert measures.primary_metric("twice", measure) == "bits_per_byte"
    assert load_task(units[0].spec).spec is units[0].spec


def test_the_modules_that_use_kinds_do_not_branch_on_their_names():
    root = Path(__file__).parents[1] / "eval"
    names = "|".join(re.escape(name) for name in KINDS)
    # `kind == "..."`, `x["kind"] != "..."`, `"ppl" if ...`, a table `"ppl": Task.from_spec`.
    branch = re.compile(
        rf'kind\w*["\]]*\s*(==|!=|in)\s*\(?"|"({names})"\s*(if|else|:\s*\w+\.from_spec)'
    )
    for path in (
        "study/suite.py",
        "study/runner.py",
        "study/measures.py",
        "study/plots.py",
        "tasks.py",
        "kinds/mc.py",
        "kinds/base.py",
    ):
        code = (root / path).read_text(encoding="utf-8")
        assert not branch.search(code), (path, branch.search(code))
