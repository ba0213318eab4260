"""Eval tasks with their options as one scorer, for the commands that score models they hold.

`surgery sweep` and `surgery localize` (surgery.diagnostics.scoring.Scorer) and
`surgery train --eval-every` receive a scorer from the command line: surgery and train never
import eval, so the command line builds it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.api import evaluate, load_model, load_tasks
from eval.options import ScoringOptions
from eval.tasks import Task


@dataclass(frozen=True)
class TaskScorer:
    """Loaded tasks and the scoring options they are scored with.

    Attributes:
        tasks: from `load_tasks`, so bad task strings or data failed when this was built.
        options: how the model is scored (its device resolved when the scorer was built).
    """

    tasks: list[Task]
    options: ScoringOptions = field(default_factory=ScoringOptions)

    @classmethod
    def of(cls, tasks: Sequence[str], options: ScoringOptions | None = None) -> TaskScorer:
        """Parse the task strings and read their data now, before any model loads.

        Raises:
            TaskSpecError: no task, a bad task string, or two tasks with one name.
            EvalDataError: a data file is missing or malformed.
        """
        return cls(load_tasks(list(tasks)), (options or ScoringOptions()).resolved())

    @property
    def config(self) -> dict[str, Any]:
        """The options as results record them: device and dtype first, then the others."""
        return self.options.config()

    def load(self, folder: Path) -> tuple[Any, Any]:
        """The model and tokenizer in `folder` on the options' device and dtype."""
        return load_model(folder, self.options.device, self.options.dtype, progress=False)

    def __call__(self, model: Any, tokenizer: Any, *, progress: bool = False) -> dict[str, Any]:
        """`evaluate`'s metrics of the tasks on this model."""
        options = self.options
        return evaluate(
            model,
            tokenizer,
            self.tasks,
            progress=progress,
            batch_size=options.batch_size,
            limit=options.limit,
            seed=options.seed,
            max_length=options.max_length,
        )["metrics"]
