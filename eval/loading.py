"""From a parsed task string to a task with its data read: the code behind each registered kind.

Each kind's reader is imported when a task of it is loaded (the readers pull in torch);
parsing and ``--help`` need only `eval.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable

from eval.tasks import KINDS, Task, TaskSpec

# Kind name -> how to read its data: each kind names its reader (`eval.kinds`).
LOADERS: dict[str, Callable[[TaskSpec], Task]] = {name: kind.load for name, kind in KINDS.items()}


def load_task(spec: TaskSpec) -> Task:
    """Read a task's data files (no model needed), so bad data fails before a model loads.

    Args:
        spec: a parsed task string (`eval.tasks.parse_task`).

    Returns:
        The task, ready to score any model.

    Raises:
        EvalDataError: a data file is missing or malformed.
    """
    return LOADERS[spec.kind](spec)
