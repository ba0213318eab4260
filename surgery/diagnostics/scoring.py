"""What sweep and localize score with: a `Scorer`, built above surgery and handed down.

surgery never imports the eval wrapper (or train): the command line builds the scorer from its
`-t/--task` strings and eval options (`eval.scorer.TaskScorer`) and passes it in, as it passes
`surgery train --eval-every` its scorer. Here it is only this protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Scorer(Protocol):
    """Loads checkpoints and scores models on a fixed list of tasks with fixed options.

    Attributes:
        config: what the results record of how models were loaded and scored (device, dtype,
            batch size, ...), in the order it is written to sweep.json.
    """

    config: dict[str, Any]

    def load(self, folder: Path) -> tuple[Any, Any]:
        """The model and tokenizer of the checkpoint in `folder`, ready to score."""
        ...

    def __call__(self, model: Any, tokenizer: Any, *, progress: bool) -> dict[str, Any]:
        """Every metric of the tasks on this model: `{"<task>/<metric>": value, "<task>/n": ...}`
        (floats for scores and standard errors, integers for counts)."""
        ...
