"""Task strings and the registry of task kinds, shared by `surgery eval` and every command that
scores a model.

Grammar: ``KIND[:ARGUMENT][:KEY=VALUE[,KEY=VALUE...]]``

Each kind is declared once, in `KINDS`: its name, what its argument is (a file, a folder, or
nothing), a one-line summary and its options with defaults and help. Parsing, the task list in
``surgery eval --help`` (`kinds_help`) and README's task list (`kinds_markdown`) all come from it.
The code that reads each kind's data lives in the task modules, found by `eval.loading`.

Every kind takes ``name`` (default: the kind), the prefix of its metric names; two tasks of one
kind in one run need different names.  The last ``:``-separated part is read as options only
when every comma-separated piece looks like ``key=value``, so paths may contain ``=``.

This module imports neither torch nor transformers: the CLI validates task strings before it
spends time loading a model.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eval.errors import TaskSpecError

_NAME_RE = re.compile(r"^[\w.+-]+$")
_OPTION_RE = re.compile(r"^\w+=")


REQUIRED = object()


@dataclass(frozen=True)
class Option:
    """One task option: how to convert its text, its default (`REQUIRED` if none), its help."""

    convert: Callable[[str], Any]
    default: Any
    help: str

    def shown_default(self) -> str:
        """The default as the help text shows it."""
        if self.default is REQUIRED:
            return "required"
        return "none" if self.default is None else str(self.default)


def _count(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = int(text)  # ValueError is turned into a TaskSpecError by the caller
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return convert


def _choice(*allowed: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return convert


def _name(text: str) -> str:
    if not _NAME_RE.match(text):
        raise ValueError("use letters, digits, '_', '.', '+' or '-'")
    return text


@dataclass(frozen=True)
class Kind:
    """A task kind: its name, its argument (None: takes none), summary and options."""

    name: str
    argument: str | None
    summary: str
    options: dict[str, Option] = field(default_factory=dict)

    @property
    def needs_path(self) -> bool:
        """Whether a task string of this kind must give an argument after the kind."""
        return self.argument is not None

    def usage(self) -> str:
        """``kind:ARGUMENT`` plus its required options, e.g. ``flores:DIR:src=L,tgt=L``."""
        text = self.name + (f":{self.argument}" if self.argument else "")
        required = [f"{key}=L" for key, o in self.options.items() if o.default is REQUIRED]
        return text + (":" + ",".join(required) if required else "")


def _shots(default: int) -> Option:
    return Option(_count(0), default, "demonstrations before each item")


def _flag(text: str) -> str:
    return _choice("auto", "true", "false")(text.lower())


# BOS as lm-evaluation-harness decides it (the tokenizer's own special tokens), or forced.
ADD_BOS = Option(
    _flag, "auto", "BOS first: auto (as the tokenizer adds it, lm-eval's rule), true, false"
)
MC_OPTIONS = {
    "shots": _shots(2),
    "sampler": Option(
        _choice("first_n", "default", "random"),
        None,
        "demonstrations: first_n (the first rows), default (lm-eval's seeded draw) or random "
        "(a draw per item from --seed); none: as lm-eval's task config",
    ),
    "fewshot_seed": Option(int, 1234, "seed of sampler=default (lm-eval's fewshot seed)"),
    "add_bos": ADD_BOS,
}


_DECLARED = [
    Kind(
        "ppl",
        "PATH",
        "rolling perplexity as lm-eval computes it: ppl (per token), word_perplexity, "
        "byte_perplexity, bits_per_byte, each with its stderr over documents; PATH is a .txt "
        "(documents separated by blank lines), "
        '.jsonl or .jsonl.gz file ("text" field), a folder of them, or a MADLAD-400 root '
        "(data/<lang>/...): one row per language",
        {
            "lang": Option(_name, None, "language name of a single file or folder"),
            "add_bos": ADD_BOS,
        },
    ),
    Kind(
        "belebele",
        "FILE",
        "Belebele reading comprehension rows (.jsonl[.gz]) in lm-eval's prompt; acc, acc_norm "
        "and their stderr; demonstrations first_n",
        MC_OPTIONS,
    ),
    Kind(
        "piqa",
        "FILE",
        "PIQA rows (.jsonl[.gz]), cloze, in lm-eval's prompts: Global-PIQA (prompt, "
        "solution0.., label; acc, acc_norm, acc_bytes) or classic PIQA (goal, sol1, sol2, label; "
        "acc, acc_norm); demonstrations default",
        MC_OPTIONS,
    ),
    Kind(
        "flores",
        "DIR",
        "FLORES+/FLORES-200 translation scored by chrF",
        {
            "src": Option(_name, REQUIRED, "source language code, e.g. eng_Latn"),
            "tgt": Option(_name, REQUIRED, "target language code"),
            "shots": _shots(2),
            "split": Option(_name, "devtest", "split to translate and draw demonstrations from"),
            "metric": Option(_choice("chrf", "chrf++"), "chrf", "chrf or chrf++"),
            "max_new_tokens": Option(_count(1), 256, "longest translation generated"),
            "src_name": Option(str, None, "source language name in the prompt"),
            "tgt_name": Option(str, None, "target language name in the prompt"),
            "add_bos": ADD_BOS,
        },
    ),
    Kind(
        "lm-eval",
        "TASKS",
        "lm-evaluation-harness tasks (comma-separated names, as lm-eval's --tasks) run on the "
        "model in memory; needs the lm-eval extra",
        {
            "shots": Option(_count(0), None, "num_fewshot; none: each task's own default"),
            "include": Option(str, None, "folder of extra task YAMLs (local data)"),
            "builtin": Option(
                lambda text: _flag(text) != "false", True, "also lm-eval's own tasks: true/false"
            ),
            "fewshot_seed": Option(int, 1234, "lm-eval's fewshot_random_seed"),
            "add_bos": ADD_BOS,
        },
    ),
    Kind(
        "copain",
        None,
        "generated in-context-learning probe (7 tasks, no files), exact match",
        {
            "shots": _shots(5),
            "n": Option(_count(1), 150, "items per task"),
            "max_new_tokens": Option(_count(1), 16, "longest answer generated"),
            "add_bos": ADD_BOS,
        },
    ),
]
KINDS: dict[str, Kind] = {kind.name: kind for kind in _DECLARED}
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
    """README's task list: one bullet per kind with its options and defaults."""
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


@dataclass(frozen=True)
class TaskSpec:
    """A parsed task string: kind, path (or None) and options with defaults filled in."""

    kind: str
    path: Path | None
    options: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def name(self) -> str:
        """Prefix of this task's metric names, e.g. `belebele` in `belebele/acc`."""
        return self.options["name"]


@dataclass(frozen=True)
class Settings:
    """Run-wide settings every task reads (resolved by `eval.api.evaluate`)."""

    batch_size: int = 8
    limit: int | None = None
    seed: int = 0
    max_length: int = 2048  # longest sequence fed to the model, prompt plus answer
    progress: bool = True
    # Called with one JSON-able dict per scored item (--log-samples), or None.
    log: Callable[[dict[str, Any]], None] | None = None


class Task(Protocol):
    """A task with its data read, ready to score any model."""

    spec: TaskSpec

    def config(self) -> dict[str, Any]:
        """The task's settings, for the output's `config`."""
        ...

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Score the model.  Returns `(metrics named relative to the task, extra config)`."""
        ...


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
    kind_name = kind_text.strip().lower()
    if kind_name not in KINDS:
        raise TaskSpecError(f"task {text!r}: unknown kind {kind_text!r}; use one of {_kinds()}")
    kind = KINDS[kind_name]
    path_text, option_text = _split_path_and_options(rest)
    if kind.needs_path and not path_text:
        raise TaskSpecError(f"task {text!r}: {kind_name} needs a path, e.g. {kind_name}:PATH")
    if not kind.needs_path and path_text:
        raise TaskSpecError(f"task {text!r}: {kind_name} takes no path, only options")
    options = _parse_options(text, kind_name, kind, option_text)
    return TaskSpec(kind_name, Path(path_text) if path_text else None, options, text)


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


def _parse_options(text: str, kind_name: str, kind: Kind, option_text: str) -> dict[str, Any]:
    allowed = {NAME_OPTION: Option(_name, kind_name, "metric prefix"), **kind.options}
    given: dict[str, str] = {}
    for piece in filter(None, (p.strip() for p in option_text.split(","))):
        key, _, value = piece.partition("=")
        key = key.strip()
        if key not in allowed:
            raise TaskSpecError(
                f"task {text!r}: unknown option {key!r} for {kind_name}; "
                f"options: {', '.join(allowed)}"
            )
        if key in given:
            raise TaskSpecError(f"task {text!r}: option {key!r} given twice")
        given[key] = value.strip()
    options: dict[str, Any] = {}
    for key, option in allowed.items():
        if key in given:
            try:
                options[key] = option.convert(given[key])
            except ValueError as error:
                raise TaskSpecError(f"task {text!r}: bad {key}={given[key]!r}: {error}") from None
        elif option.default is REQUIRED:
            raise TaskSpecError(f"task {text!r}: {kind_name} needs {key}=...")
        else:
            options[key] = option.default
    return options
