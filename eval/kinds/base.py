"""What a task kind is, what a task of it is, and the registry every kind's module adds itself to.

A `Kind` holds everything that differs between kinds: its options, how a suite entry of it is
read and expanded over languages, how its data is read (its loader, a function from a `TaskSpec`
to a `Task`), its metric prefix, and the statistics compare resamples. The commands ask the
kind; no module outside a kind's own branches on its name.

`TaskSpec` (a parsed task string), `Settings` (what every task's run reads) and the `Task`
protocol are what a kind's loader takes and returns; `eval.tasks` parses task strings into them.

This module imports neither torch nor transformers (the CLI validates task strings before it
spends time loading a model).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eval.options import DEFAULT_BATCH_SIZE
from surgery.hub.datasets import DatasetRef

_NAME_RE = re.compile(r"^[\w.+-]+$")

REQUIRED = object()

# Kind name -> kind, sorted by name once every kind's module is imported (`eval.kinds`): the
# order of --help, of the docs' list and of messages.
KINDS: dict[str, Kind] = {}

# `(variant, direction, options)` of one language's expansion of a suite task.
Expansion = tuple[str | None, str | None, dict[str, Any]]


@dataclass(frozen=True)
class TaskSpec:
    """A parsed task string: kind, path (or None) and options with defaults filled in."""

    kind: str
    path: Path | None
    options: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    dataset: DatasetRef | None = None  # a Hub dataset instead of a path (``hub:ID...``)

    @property
    def name(self) -> str:
        """Prefix of this task's metric names, e.g. `belebele` in `belebele/acc`."""
        return self.options["name"]


@dataclass(frozen=True)
class Settings:
    """Run-wide settings every task reads (resolved by `eval.api.evaluate`)."""

    batch_size: int = DEFAULT_BATCH_SIZE
    limit: int | None = None
    seed: int = 0
    max_length: int = 2048  # longest sequence fed to the model, prompt plus answer
    progress: bool = True
    # Multiple choice: run the contexts' shared token prefix once (eval.prefix_cache).
    prefix_cache: bool = True
    # Called with one JSON-able dict per scored item (--log-samples), or None.
    log: Callable[[dict[str, Any]], None] | None = None
    # Score only these items (indices among the first `limit`), e.g. one half of a suite's
    # items (`eval.study.halves`); None scores them all. Prompts and demonstrations are those
    # of the whole run, so an item scores the same in a half as in the whole.
    items: frozenset[int] | None = None

    def keep(self, count: int) -> list[int]:
        """The indices among the first `count` items that are scored."""
        if self.items is None:
            return list(range(count))
        return [index for index in range(count) if index in self.items]


class Task(Protocol):
    """A task with its data read, ready to score any model."""

    spec: TaskSpec

    def config(self) -> dict[str, Any]:
        """The task's settings, for the output's `config`."""
        ...

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Score the model.  Returns `(metrics named relative to the task, extra config)`."""
        ...


class HalvableTask(Task, Protocol):
    """A task whose items can be split into halves (`eval.study.halves`)."""

    def half_items(self, limit: int | None, seed: int) -> list[int]:
        """The indices of the items (among the first `limit`) that may go into a half: those
        that serve as no demonstration in the prompt of another.

        Raises:
            TaskSpecError: the task draws its demonstrations from the items it scores.
        """
        ...


@dataclass(frozen=True)
class Option:
    """One task option: how to convert its text, its default (`REQUIRED` if none), its help.

    raw: the converter gets a suite's value as written (a YAML list, a string with its
    surrounding spaces and newlines: templates and delimiters), not its stripped text.
    """

    convert: Callable[[Any], Any]
    default: Any
    help: str
    raw: bool = False

    def shown_default(self) -> str:
        """The default as the help text shows it (blank strings quoted)."""
        if self.default is REQUIRED:
            return "required"
        if isinstance(self.default, str) and not self.default.strip():
            return repr(self.default)
        return "none" if self.default is None else str(self.default)


def count(minimum: int) -> Callable[[str], int]:
    """A converter to an integer of at least `minimum`."""

    def convert(text: str) -> int:
        value = int(text)  # ValueError is turned into a TaskSpecError by the caller
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return convert


def choice(*allowed: str) -> Callable[[str], str]:
    """A converter that accepts only the `allowed` strings."""

    def convert(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return convert


def name(text: str) -> str:
    """A name: letters, digits, '_', '.', '+' or '-'."""
    if not _NAME_RE.match(text):
        raise ValueError("use letters, digits, '_', '.', '+' or '-'")
    return text


def flag(text: str) -> str:
    """auto, true or false (any case)."""
    return choice("auto", "true", "false")(text.lower())


def shots(default: int) -> Option:
    """The number of demonstrations."""
    return Option(count(0), default, "demonstrations before each item")


# BOS as lm-evaluation-harness decides it (the tokenizer's own special tokens), or forced.
ADD_BOS = Option(
    flag, "auto", "BOS first: auto (as the tokenizer adds it, lm-eval's rule), true, false"
)


@dataclass(frozen=True)
class Kind:
    """A task kind: its name, its argument (None: takes none), summary and options, and how the
    suite, the runner and compare treat it.

    loader: reads a task's data: a function from a `TaskSpec` to a `Task` (defined in the kind's
        module; it imports torch only when it scores a model).
    measure: the per-item statistics compare resamples (`eval.study.measures.MEASURES`).
    primary: the metric tables and plots show (None: the measure's first).
    sampler: where demonstrations come from when the task names no sampler (None: drawn).
    role: which axis of the trade-off plot the kind is preferred on (learning or cost).
    hub: whether the kind reads Hub datasets (``hub:ID[#CONFIG][@SPLIT[@REVISION]]``, or a
        suite entry's ``dataset:``) as well as paths.
    """

    name: str
    argument: str | None
    summary: str
    options: dict[str, Option] = field(default_factory=dict)
    _: KW_ONLY
    loader: Callable[[TaskSpec], Task]
    measure: str = "outcomes"
    primary: str | None = None
    sampler: str | None = None
    role: str | None = None
    hub: bool = False

    @property
    def needs_path(self) -> bool:
        """Whether a task string of this kind must give an argument after the kind."""
        return self.argument is not None

    def usage(self) -> str:
        """``kind:ARGUMENT`` plus its required options, e.g. ``flores:DIR:src=L,tgt=L``."""
        text = self.name + (f":{self.argument}" if self.argument else "")
        required = [f"{key}=L" for key, o in self.options.items() if o.default is REQUIRED]
        return text + (":" + ",".join(required) if required else "")

    # -- the suite ------------------------------------------------------------------------

    def suite_entry(self, entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Take the path and the kind's own keys out of a suite entry (the rest are options).

        Returns:
            `(path or None, extras)`; extras are kept with the suite task (`expand` gets them).

        Raises:
            ValueError: a key the kind refuses in a suite (its message names it).
        """
        return self.dataset_entry(entry, "path"), {}

    def dataset_entry(self, entry: dict[str, Any], path_key: str) -> Any:
        """The entry's path, or its Hub dataset (``dataset``, ``config``, ``split``,
        ``revision``) as a ``hub:`` template."""
        if "dataset" not in entry:
            return entry.pop(path_key, None)
        if not self.hub:
            raise ValueError(f"{self.name} does not read Hub datasets; give {path_key}:")
        if path_key in entry:
            raise ValueError(f"give {path_key}: or dataset:, not both")
        parts = {key: entry.pop(key, None) for key in ("dataset", "config", "split", "revision")}
        if not all(value is None or isinstance(value, str) for value in parts.values()):
            raise ValueError("dataset, config, split and revision must be strings")
        text = "hub:" + parts["dataset"] + (f"#{parts['config']}" if parts["config"] else "")
        if parts["split"] or parts["revision"]:
            text += "@" + (parts["split"] or "")
        return text + (f"@{parts['revision']}" if parts["revision"] else "")

    def suite_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """The kind's own keys as results.json's ``suite`` records them."""
        return {}

    def extra_templates(self, extras: dict[str, Any]) -> list[str]:
        """Templates among the kind's own keys (expanded per language like the path)."""
        return []

    def check_suite(self, per_language: bool) -> str | None:
        """Why a suite task of this kind is wrong as written, or None."""
        return None

    def expand(
        self, options: dict[str, Any], lang_vars: dict[str, str], extras: dict[str, Any]
    ) -> list[Expansion]:
        """The kind's task options for one language of a suite (one entry per direction)."""
        return [(None, None, options)]

    def rooted(self, path: Path | None, root: Path | None) -> Path | None:
        """The task's path under the suite's data root (relative paths only)."""
        if path is None or root is None or path.is_absolute() or not self.reads_path:
            return path
        return root / path

    # -- data and metrics -----------------------------------------------------------------

    @property
    def reads_path(self) -> bool:
        """Whether the argument is a file or folder of data (not, say, a list of names)."""
        return self.needs_path

    def missing(self, spec: Any) -> str | None:
        """The data path a task needs that does not exist, or None when all of it is there."""
        if spec.path is None or not self.reads_path:
            return None
        return None if spec.path.exists() else str(spec.path)

    def metric_prefix(self, task: str, lang: str | None) -> str:
        """The prefix of a suite unit's metric names in `evaluate`'s output."""
        return f"{task}/"


def register(kind: Kind) -> Kind:
    """Add a kind to `KINDS` (called once, in the kind's own module)."""
    if kind.name in KINDS:
        raise ValueError(f"task kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


MC_OPTIONS = {
    "shots": shots(2),
    "sampler": Option(
        choice("first_n", "default", "random"),
        None,
        "demonstrations: first_n (the first rows), default (lm-eval's seeded draw) or random "
        "(a draw per item from --seed); none: as lm-eval's task config",
    ),
    "fewshot_seed": Option(int, 1234, "seed of sampler=default (lm-eval's fewshot seed)"),
    "config": Option(str, None, "the config to read when the path is a dataset snapshot folder"),
    "split": Option(name, "test", "the split to read when the path is a dataset snapshot folder"),
    "add_bos": ADD_BOS,
}
