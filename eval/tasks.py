"""Task strings, shared by `surgery eval` and every command that scores a model: parsing them,
listing the kinds, and loading a task.

Grammar: ``KIND[:ARGUMENT][:KEY=VALUE[,KEY=VALUE...]]``

Each kind is one module of `eval.kinds` (registered in `KINDS`): its name, what its argument is
(a file, a folder, or nothing), a one-line summary, its options with defaults and help, and its
loader. Parsing, the task list in ``surgery eval --help`` (`kinds_help`), the task list in
docs/evaluation.md (`kinds_markdown`) and `load_task` all come from it. `TaskSpec`, `Settings`
and the `Task` protocol are defined with the kinds (`eval.kinds.base`) and used from here.

Every kind takes ``name`` (default: the kind), the prefix of its metric names; two tasks of one
kind in one run need different names.  The last ``:``-separated part is read as options only
when every comma-separated piece looks like ``key=value``, so paths may contain ``=``.

This module imports neither torch nor transformers: the CLI validates task strings before it
spends time loading a model.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.errors import TaskSpecError
from eval.kinds import KINDS, REQUIRED, Kind, Option
from eval.kinds.base import HalvableTask, Settings, Task, TaskSpec
from eval.kinds.base import name as _name
from surgery.hub.datasets import DatasetRef, is_dataset_ref, parse_dataset_ref

__all__ = [
    "KINDS",
    "REQUIRED",
    "HalvableTask",
    "Settings",
    "Task",
    "TaskSpec",
    "argument",
    "build_spec",
    "check_unique_names",
    "kinds_help",
    "kinds_markdown",
    "load_task",
    "parse_task",
]

_OPTION_RE = re.compile(r"^\w+=")

NAME_OPTION = "name"


def kinds_help() -> str:
    """The task list of ``surgery eval --help``: one block per kind, options with defaults."""
    lines = []
    for kind in KINDS.values():
        lines.append(f"  {kind.usage()}")
        lines += [f"      {line}" for line in textwrap.wrap(kind.summary, 74)]
        for key, option in kind.options.items():
            lines.append(f"      {key}: {option.help} [{option.shown_default()}]")
    lines.append("Every task also takes name=NAME, its metric prefix (default: the kind).")
    return "\n".join(lines)


def kinds_markdown() -> str:
    """The task list of docs/evaluation.md: one bullet per kind with its options and defaults."""
    lines = []
    for kind in KINDS.values():
        options = "; ".join(
            f"`{key}` {option.help} ({option.shown_default()})"
            for key, option in kind.options.items()
        )
        lines.append(
            f"- `{kind.usage()}`: {kind.summary}." + (f" Options: {options}." if options else "")
        )
    lines.append(
        "- Every task also takes `name=NAME`, the prefix of its metric names (default: the kind)."
    )
    return "\n".join(lines)


def parse_task(text: str) -> TaskSpec:
    """Parse a task string (grammar in this module's docstring).

    Args:
        text: e.g. ``"belebele:data/eng_Latn.jsonl:shots=2"`` or ``"copain"``.

    Returns:
        The `TaskSpec`, every option present (defaults filled in).

    Raises:
        TaskSpecError: unknown kind or option, a missing or unexpected path, a bad value.
    """
    kind_text, _, rest = text.strip().partition(":")
    path_text, option_text = _split_path_and_options(rest)
    given = _split_options(text, option_text)
    path, dataset = argument(text, path_text)
    return build_spec(kind_text.strip(), path, given, text, dataset)


def argument(text: str, path_text: str) -> tuple[Path | None, DatasetRef | None]:
    """A task's argument: a path, or a Hub dataset (``hub:ID[#CONFIG][@SPLIT[@REVISION]]``).

    Raises:
        TaskSpecError: a malformed Hub dataset reference.
    """
    if not path_text:
        return None, None
    if not is_dataset_ref(path_text):
        return Path(path_text), None
    try:
        return None, parse_dataset_ref(path_text)
    except ValueError as error:
        raise TaskSpecError(f"task {text!r}: {error}") from None


def build_spec(
    kind_name: str,
    path: Path | None,
    given: dict[str, Any],
    text: str,
    dataset: DatasetRef | None = None,
) -> TaskSpec:
    """A `TaskSpec` from a kind, a path and options as a mapping: a task string once split, or
    a suite file's task entry.

    Values are checked and converted as in a task string (YAML's ``2`` is read as ``"2"``).

    Args:
        kind_name: a kind of `KINDS` (any case).
        path: its argument, or None.
        given: option -> value.
        text: how the task is named in messages (and its `TaskSpec.text`).
        dataset: a Hub dataset instead of the path (kinds whose `Kind.hub` is true).

    Returns:
        The `TaskSpec`, every option present (defaults filled in).

    Raises:
        TaskSpecError: unknown kind or option, a missing or unexpected path, a bad value.
    """
    kind = KINDS.get(kind_name.lower())
    if kind is None:
        raise TaskSpecError(f"task {text!r}: unknown kind {kind_name!r}; use one of {_kinds()}")
    if dataset is not None and not kind.hub:
        raise TaskSpecError(f"task {text!r}: {kind.name} does not read Hub datasets (hub:...)")
    if kind.needs_path and path is None and dataset is None:
        raise TaskSpecError(f"task {text!r}: {kind.name} needs a path, e.g. {kind.name}:PATH")
    if not kind.needs_path and path is not None:
        raise TaskSpecError(f"task {text!r}: {kind.name} takes no path, only options")
    return TaskSpec(kind.name, path, _convert_options(text, kind, given), text, dataset)


def load_task(spec: TaskSpec) -> Task:
    """Read a task's data files through its kind's loader (no model needed), so bad data fails
    before a model loads.

    Args:
        spec: a parsed task string (`parse_task`).

    Returns:
        The task, ready to score any model.

    Raises:
        EvalDataError: a data file is missing or malformed.
    """
    return KINDS[spec.kind].loader(spec)


def check_unique_names(specs: Sequence[TaskSpec]) -> None:
    """Raise `TaskSpecError` if two tasks would write the same metric names."""
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise TaskSpecError(
                f"tasks {seen[spec.name]!r} and {spec.text!r} share the name {spec.name!r}; "
                "add name=... to one of them"
            )
        seen[spec.name] = spec.text


def _kinds() -> str:
    return ", ".join(KINDS)


def _split_path_and_options(rest: str) -> tuple[str, str]:
    head, _, tail = rest.rpartition(":")
    pieces = tail.split(",")
    if tail and all(_OPTION_RE.match(piece.strip()) for piece in pieces):
        return head.strip(), tail
    return rest.strip(), ""


def _split_options(text: str, option_text: str) -> dict[str, str]:
    given: dict[str, str] = {}
    for piece in filter(None, (p.strip() for p in option_text.split(","))):
        key, _, value = piece.partition("=")
        key = key.strip()
        if key in given:
            raise TaskSpecError(f"task {text!r}: option {key!r} given twice")
        given[key] = value.strip()
    return given


def _convert_options(text: str, kind: Kind, given: dict[str, Any]) -> dict[str, Any]:
    allowed = {NAME_OPTION: Option(_name, kind.name, "metric prefix"), **kind.options}
    # YAML's 2 is read as "2"; templates and delimiters keep their spaces and lists.
    given = {
        key: value if key in allowed and allowed[key].raw else str(value).strip()
        for key, value in given.items()
    }
    unknown = [key for key in given if key not in allowed]
    if unknown:
        raise TaskSpecError(
            f"task {text!r}: unknown option {unknown[0]!r} for {kind.name}; "
            f"options: {', '.join(allowed)}"
        )
    options: dict[str, Any] = {}
    for key, option in allowed.items():
        if key in given:
            try:
                options[key] = option.convert(given[key])
            except ValueError as error:
                raise TaskSpecError(f"task {text!r}: bad {key}={given[key]!r}: {error}") from None
        elif option.default is REQUIRED:
            raise TaskSpecError(f"task {text!r}: {kind.name} needs {key}=...")
        else:
            options[key] = option.default
    return options
