"""The scoring options, declared once for every command that scores a model: one typed value.

`ScoringOptions` holds how a model is scored (device, dtype, batch size, limit, seed, max length,
half and split seed). `scoring_options(...)` adds its click options to a command and hands the
command one `scoring: ScoringOptions` argument; eval, sweep, localize and search pass that value
down whole. `surgery train --eval-every` takes the same declaration under `--eval-*` names
(`prefix="eval-"`), so they do not collide with train's own `--batch-size` and `--seed`.
Old spellings (`--eval` for `-t`, eval's `--dtype` for `--eval-dtype`) still run for one
release, hidden, with a note (`surgery.options.renamed`).

Only click is imported here: ``surgery --help`` must not pay for torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import click

from surgery.options import DEVICE_HELP, renamed


class DefaultBatchSize(int):
    """The batch size when none is given: 8 items per forward pass, equal to 8 and recorded as
    8. Generation alone tells it from a given 8 (`batch_size_given`): it sizes its batches by
    memory instead (`eval.generation.generation_batches`)."""


DEFAULT_BATCH_SIZE = DefaultBatchSize(8)


def batch_size_given(batch_size: int) -> bool:
    """Whether `batch_size` was chosen (a plain int), not `DEFAULT_BATCH_SIZE`."""
    return not isinstance(batch_size, DefaultBatchSize)


@dataclass(frozen=True)
class ScoringOptions:
    """How a model is scored.

    Attributes:
        device: cpu, cuda, cuda:1, ...; None: the accelerator when one is present
            (`surgery.core.devices.resolve_device`, applied by `resolved`).
        dtype: dtype the model is scored in (bf16, fp16, fp32); None: fp32 on cpu, bf16 otherwise.
        batch_size: items (or windows, or prompts) per forward pass; `DEFAULT_BATCH_SIZE`
            when not given, where generation sizes its batches by memory.
        limit: score only the first N items per task (or unit).
        seed: Copain items and few-shot demonstrations.
        max_length: longest sequence fed to the model; None: the model's context.
        half: with a suite, score only the search or the report half of each unit's items.
        split_seed: the seed that splits the items into halves.
    """

    device: str | None = None
    dtype: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    limit: int | None = None
    seed: int = 0
    max_length: int | None = None
    half: str | None = None
    split_seed: int = 0

    def resolved(self) -> ScoringOptions:
        """A copy with the device chosen (run time only: imports torch when none was given)."""
        from surgery.core.devices import resolve_device

        return replace(self, device=resolve_device(self.device))

    def config(self) -> dict[str, Any]:
        """What results record of these options: device and dtype first, then the others."""
        from eval.model_loading import dtype_name  # run time only: it imports torch

        return {
            "device": self.device,
            # The dtype the model loads in (the default resolved), once the device is known.
            "dtype": dtype_name(self.dtype, self.device) if self.device else self.dtype,
            "batch_size": self.batch_size,
            "limit": self.limit,
            "seed": self.seed,
            "max_length": self.max_length,
        }


# -t/--task alone: also taken by `surgery train --eval-every`.
task_option = click.option(
    "-t",
    "--task",
    "tasks",
    multiple=True,
    metavar="TASK",
    help="Task string, repeatable (grammar: surgery eval --help): copain, ppl:data/ind, ...",
)
tasks_options = (task_option, renamed("--eval", "-t/--task", "tasks", multiple=True))

suite_option = click.option(
    "--suite",
    type=click.Path(dir_okay=False),
    help="Suite YAML: families, languages and tasks (format: docs/study.md), scored by each "
    "task's primary metric over held-in, held-out and others languages.",
)

# Each field's click option: (flag without prefix, keyword arguments).
_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    "device": ("--device", {"default": None, "help": DEVICE_HELP}),
    "dtype": (
        "--eval-dtype",
        {"help": "Dtype the model is scored in: bf16, fp16 or fp32 [fp32 on cpu, bf16 otherwise]."},
    ),
    "batch_size": (
        "--batch-size",
        {
            "default": 8,
            "show_default": True,
            "type": click.IntRange(min=1),
            "help": "Items (or windows, or prompts) per forward pass; not given, generation "
            "batches as many prompts as fit a memory budget.",
        },
    ),
    "limit": (
        "--limit",
        {"type": click.IntRange(min=1), "help": "Score only the first N items per task."},
    ),
    "seed": (
        "--seed",
        {
            "default": 0,
            "show_default": True,
            "type": int,
            "help": "Seeds Copain's items and the few-shot demonstrations.",
        },
    ),
    "max_length": (
        "--max-length",
        {
            "type": click.IntRange(min=2),
            "help": "Longest sequence fed to the model (ppl window; prompts cut from the left) "
            "[default: the model's context].",
        },
    ),
    "half": (
        "--half",
        {
            "type": click.Choice(["search", "report"]),
            "help": "With --suite: score one half of each unit's items, split once by "
            "--split-seed (items that serve as few-shot demonstrations are in neither): the "
            "halves `surgery search` chooses and reports on.",
        },
    ),
    "split_seed": (
        "--split-seed",
        {
            "default": 0,
            "show_default": True,
            "type": int,
            "help": "The seed that splits each unit's items into the search and report halves.",
        },
    ),
}


def _given(key: str) -> bool:
    """Whether the running command's parameter `key` was given (False outside a command)."""
    from surgery.options import given

    return click.get_current_context(silent=True) is not None and given(key)


def _flag(name: str, prefix: str) -> str:
    flag = _FIELDS[name][0]
    # --eval-dtype under the prefix eval- stays --eval-dtype.
    return flag if flag.startswith("--" + prefix) else "--" + prefix + flag[2:]


def scoring_options(
    *names: str, prefix: str = "", dest: str = "scoring", old_spellings: bool = False
) -> Callable:
    """The click options of `ScoringOptions`' fields `names` (all when none is named), under
    `--PREFIX...` names, collapsed into one `ScoringOptions` argument `dest` of the command
    (the fields not chosen keep their defaults).

    Args:
        names: fields of `ScoringOptions`.
        prefix: put before each flag (`eval-`: `--eval-batch-size`).
        dest: the command's argument that receives the value.
        old_spellings: also take `--dtype` for `--eval-dtype` (eval, sweep and localize did).
    """
    chosen = names or tuple(_FIELDS)
    keys = {name: prefix.replace("-", "_") + name for name in chosen}

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def collapsed(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(key) for name, key in keys.items()}
            if "batch_size" in values and not _given(keys["batch_size"]):
                values["batch_size"] = DEFAULT_BATCH_SIZE
            return command(*args, **{dest: ScoringOptions(**values)}, **kwargs)

        wrapper = collapsed
        for name in reversed(chosen):
            wrapper = click.option(_flag(name, prefix), keys[name], **_FIELDS[name][1])(wrapper)
        if old_spellings:
            # eval's --dtype until this release: the dtype a model is scored in.
            wrapper = renamed("--dtype", "--eval-dtype", "dtype")(wrapper)
        return wrapper

    return decorate


def eval_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """-t/--task (the command gets ``tasks``) and every scoring option (``scoring``), for the
    commands that score models they hold or blend (eval, sweep, localize)."""
    for decorator in reversed((*tasks_options, scoring_options(old_spellings=True))):
        command = decorator(command)
    return command


def check_halves(scoring: ScoringOptions, with_suite: bool) -> None:
    """Refuse --half without --suite (and --split-seed given without --half).

    Raises:
        click.UsageError: one of them.
    """
    from surgery.options import given

    if scoring.half and not with_suite:
        raise click.UsageError("--half goes with --suite")
    if given("split_seed") and scoring.half is None:
        raise click.UsageError("--split-seed goes with --half")
