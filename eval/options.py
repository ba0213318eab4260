"""The eval options, declared once for every command that scores a model (eval, sweep, localize).

One vocabulary: ``-t/--task TASK`` (repeatable) and ``--eval-dtype``, with ``--eval`` and
``--dtype`` (the spellings `sweep`/`localize` and `eval` used before) kept as hidden aliases.
The decorated command receives ``tasks`` (a tuple of task strings) and ``eval_options`` (a dict
for `eval.api.evaluate` and `load_model`: device, dtype, batch_size, limit, seed, max_length).

Only click is imported here: ``surgery --help`` must not pay for torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

EVAL_KEYS = ("device", "dtype", "batch_size", "limit", "seed", "max_length")

# -t/--task alone: also taken by `surgery train --eval-every` (whose --dtype, --batch-size and
# --seed are training options).
task_option = click.option(
    "-t",
    "--task",
    "tasks",
    multiple=True,
    metavar="TASK",
    help="Task string, repeatable (grammar: surgery eval --help): copain, ppl:data/ind, ...",
)

_OPTIONS = (
    task_option,
    click.option("--eval", "tasks_alias", multiple=True, hidden=True),
    click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ..."),
    click.option(
        "--eval-dtype",
        "dtype",
        default=None,
        help="Dtype the model is scored in: bf16, fp16 or fp32 [fp32 on cpu, bf16 otherwise].",
    ),
    click.option("--dtype", "dtype_alias", default=None, hidden=True),
    click.option(
        "--batch-size",
        default=8,
        show_default=True,
        type=click.IntRange(min=1),
        help="Items (or windows, or prompts) per forward pass.",
    ),
    click.option(
        "--limit", type=click.IntRange(min=1), help="Score only the first N items per task."
    ),
    click.option(
        "--seed",
        default=0,
        show_default=True,
        type=int,
        help="Copain items and demonstrations.",
    ),
    click.option(
        "--max-length",
        type=click.IntRange(min=2),
        help="Longest sequence fed to the model (ppl window; prompts cut from the left) "
        "[default: the model's context].",
    ),
)


def eval_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the eval options to a click command; it gets ``tasks`` and ``eval_options``.

    Args:
        command: the command function (click decorators below this one are kept).

    Returns:
        The function with the options attached.

    Raises:
        click.UsageError: (when the command runs) ``--eval-dtype`` and ``--dtype`` disagree.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["tasks"] = tuple(kwargs.pop("tasks")) + tuple(kwargs.pop("tasks_alias"))
        alias = kwargs.pop("dtype_alias")
        if alias is not None and kwargs["dtype"] not in (None, alias):
            raise click.UsageError("--dtype is --eval-dtype; give it once")
        kwargs["dtype"] = kwargs["dtype"] or alias
        kwargs["eval_options"] = {key: kwargs.pop(key) for key in EVAL_KEYS}
        return command(*args, **kwargs)

    for decorator in reversed(_OPTIONS):
        wrapper = decorator(wrapper)
    return wrapper


# A suite instead of tasks, for the commands that score models they blend (sweep, localize).
suite_options = (
    click.option(
        "--suite",
        type=click.Path(dir_okay=False),
        help="Score a suite instead of -t tasks: each task's primary metric averaged over "
        "held-in, held-out and others languages as `surgery compare` averages them.",
    ),
    click.option(
        "--half",
        type=click.Choice(["search", "report"]),
        help="With --suite: only one half of each unit's items (as `surgery eval --half`).",
    ),
    click.option(
        "--split-seed",
        type=int,
        default=0,
        show_default=True,
        help="With --half: the seed that splits the items.",
    ),
)


def with_suite_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --suite, --half and --split-seed; the command gets ``suite`` (a dict: path, half,
    split_seed; path None without --suite).

    Raises:
        click.UsageError: (when the command runs) --half without --suite.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        suite = {key: kwargs.pop(key) for key in ("suite", "half", "split_seed")}
        if suite["half"] and not suite["suite"]:
            raise click.UsageError("--half goes with --suite")
        kwargs["suite"] = suite
        return command(*args, **kwargs)

    for decorator in reversed(suite_options):
        wrapper = decorator(wrapper)
    return wrapper
