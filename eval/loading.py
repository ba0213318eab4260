"""From a parsed task string to a task with its data read: the code behind each registered kind.

Imported only when tasks are loaded (it pulls in torch through the task modules); parsing and
``--help`` need only `eval.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable

from eval.copain import CopainTask
from eval.harness import HarnessTask
from eval.multiple_choice import MultipleChoiceTask
from eval.perplexity import PerplexityTask
from eval.tasks import KINDS, Task, TaskSpec
from eval.translation import TranslationTask

# Kind name -> how to read its data. tests/test_eval_tasks.py checks it covers `KINDS`.
LOADERS: dict[str, Callable[[TaskSpec], Task]] = {
    "ppl": PerplexityTask.from_spec,
    "belebele": MultipleChoiceTask.from_spec,
    "piqa": MultipleChoiceTask.from_spec,
    "flores": TranslationTask.from_spec,
    "copain": CopainTask.from_spec,
    "lm-eval": HarnessTask.from_spec,
}


def load_task(spec: TaskSpec) -> Task:
    """Read a task's data files (no model needed), so bad data fails before a model loads.

    Args:
        spec: a parsed task string (`eval.tasks.parse_task`).

    Returns:
        The task, ready to score any model.

    Raises:
        EvalDataError: a data file is missing or malformed.
    """
    assert set(LOADERS) == set(KINDS), "every registered kind needs a loader"
    return LOADERS[spec.kind](spec)
