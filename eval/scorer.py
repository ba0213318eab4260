"""Eval tasks with their options as one scorer, for the commands that score models they hold.

`surgery sweep` and `surgery localize` (surgery.diagnostics.scoring.Scorer) and
`surgery train --eval-every` receive a scorer from the command line: surgery and train never
import eval, so the command line builds it here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.api import evaluate, load_model, load_tasks
from eval.tasks import Task

LOAD_KEYS = ("device", "dtype")  # of the eval options, those for `load_model`


@dataclass(frozen=True)
class TaskScorer:
    """Loaded tasks and the eval options (device, dtype, batch_size, limit, seed, max_length)
    they are scored with; missing options take `surgery eval`'s defaults.

    Attributes:
        tasks: from `load_tasks`, so bad task strings or data failed when this was built.
        options: the eval options given (`eval.options.EVAL_KEYS`).
    """

    tasks: list[Task]
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, tasks: Sequence[str], options: Mapping[str, Any] | None = None) -> TaskScorer:
        """Parse the task strings and read their data now, before any model loads.

        Raises:
            TaskSpecError: no task, a bad task string, or two tasks with one name.
            EvalDataError: a data file is missing or malformed.
        """
        return cls(load_tasks(list(tasks)), dict(options or {}))

    @property
    def config(self) -> dict[str, Any]:
        """The options as results record them: device and dtype first, then the others given."""
        loading = {"device": self.options.get("device", "cpu"), "dtype": self.options.get("dtype")}
        return loading | {k: v for k, v in self.options.items() if k not in LOAD_KEYS}

    def load(self, folder: Path) -> tuple[Any, Any]:
        """The model and tokenizer in `folder` on the options' device and dtype."""
        return load_model(folder, self.config["device"], self.config["dtype"], progress=False)

    def __call__(self, model: Any, tokenizer: Any, *, progress: bool = False) -> dict[str, Any]:
        """`evaluate`'s metrics of the tasks on this model."""
        options = {k: v for k, v in self.options.items() if k not in LOAD_KEYS}
        return evaluate(model, tokenizer, self.tasks, progress=progress, **options)["metrics"]
