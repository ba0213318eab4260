"""The scorers eval builds for the layers below it: sweep's and localize's
(`surgery.diagnostics.scoring.Scorer`) and train's periodic eval (`train.command.EvalHook`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from eval.options import ScoringOptions, scoring_options, task_option
from surgery.options import options
from train.command import EvalHook

if TYPE_CHECKING:
    from eval.scorer import TaskScorer
    from eval.study.memory import SuiteScorer


def scorer_for(
    tasks: Sequence[str],
    scoring: ScoringOptions,
    suite: str | None = None,
    trained: str | None = None,
) -> TaskScorer | SuiteScorer:
    """The scorer sweep and localize receive (surgery never imports eval): the tasks (or the
    suite's units), parsed and their data read now, before any checkpoint is read, scored with
    the scoring options."""
    if suite:
        if tasks:
            raise click.UsageError("--suite names the tasks; give --suite or -t/--task, not both")
        from eval.study.memory import SuiteScorer

        return SuiteScorer.of(suite, scoring, trained)
    from eval.scorer import TaskScorer

    return TaskScorer.of(tasks, scoring)


# train's periodic eval: -t/--task and the scoring options that apply to a model already on its
# device, under --eval-* names (train has its own --batch-size and --seed).
TRAIN_EVAL_OPTIONS = options(
    task_option,
    scoring_options(
        "batch_size", "limit", "seed", "max_length", prefix="eval-", dest="eval_scoring"
    ),
)


def train_scorer(
    tasks: Sequence[str], scoring: ScoringOptions
) -> Callable[[Any, Any], dict[str, float]]:
    """`score(model, tokenizer)` for `train --eval-every`, built here because train never
    imports eval: the eval wrapper's tasks, parsed and their data read now (a typo fails before
    training), scored with the --eval-* options on the model as it trains."""
    scorer = scorer_for(tasks, scoring)

    def score(model, tokenizer) -> dict[str, float]:
        metrics = scorer(model, tokenizer, progress=False)
        # Scores only: item and token counts do not change during a run.
        return {name: value for name, value in metrics.items() if isinstance(value, float)}

    return score


# What `surgery train` takes from eval: its -t/--task and --eval-* options, and the scorer.
TRAIN_EVAL = EvalHook(TRAIN_EVAL_OPTIONS, train_scorer)
