"""What the search's modules share: the half of the suite they score, and DIR's JSON files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from eval.study.memory import PreparedSuite, prepare_suite
from eval.study.results import replace_text
from eval.study.runner import SuiteRun
from eval.study.suite import Unit


def prepare_half(options: Any, scoring: SuiteRun, half: str, needed: list[Any]) -> PreparedSuite:
    """The units of the measured tasks in the measured splits, on one half of their items.

    Args:
        options: the search's options (the suite, TRAINED).
        scoring: how the models are scored, the split seed of the halves included.
        half: search or report.
        needed: the objectives (and budgets') measured.
    """
    tasks = {objective.measure.task for objective in needed}
    splits = {objective.split for objective in needed}

    def wanted(unit: Unit) -> bool:
        name = unit.task if unit.variant is None else f"{unit.task}[{unit.variant}]"
        split = unit.split or ("others" if unit.lang else None)
        return name in tasks and split in splits

    settings = replace(scoring, half=half)
    return prepare_suite(options.suite, settings, options.trained, wanted)


def write_json(path: Path, data: Any) -> None:
    """Atomically replace `path` with `data` as indented JSON."""
    replace_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
