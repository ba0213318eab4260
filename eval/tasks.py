"""Task strings, shared by `surgery eval` and every command that scores a model.

Grammar: ``KIND[:PATH][:KEY=VALUE[,KEY=VALUE...]]``

- ``ppl:PATH``  perplexity; PATH is a .txt, .jsonl or .jsonl.gz file, a folder of them (one
  language, named after the folder), or a MADLAD-400 root whose ``data/<lang>/`` folders each
  give one language.  Options: ``lang`` (name of a single file's language).
- ``belebele:FILE``  Belebele rows (.jsonl[.gz]).  Options: ``shots`` (default 2).
- ``piqa:FILE``  Global-PIQA rows (.jsonl[.gz]), cloze.  Options: ``shots`` (default 2).
- ``flores:DIR:src=LANG,tgt=LANG``  FLORES+/FLORES-200 translation, chrF.  Options: ``shots``
  (default 2), ``split`` (default devtest), ``metric`` (chrf or chrf++), ``max_new_tokens``
  (default 256), ``src_name``/``tgt_name`` (language names in the prompt).
- ``copain``  the generated in-context-learning probe, no files.  Options: ``shots``
  (default 5), ``n`` (items per task, default 150), ``max_new_tokens`` (default 16).

Every kind takes ``name`` (default: the kind), the prefix of its metric names; two tasks of one
kind in one run need different names.  The last ``:``-separated part is read as options only
when every comma-separated piece looks like ``key=value``, so paths may contain ``=``.

This module imports neither torch nor transformers: the CLI validates task strings before it
spends time loading a model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eval.errors import TaskSpecError

_NAME_RE = re.compile(r"^[\w.+-]+$")
_OPTION_RE = re.compile(r"^\w+=")


@dataclass(frozen=True)
class Option:
    """One task option: how to convert its text, and its default (`REQUIRED` if none)."""

    convert: Callable[[str], Any]
    default: Any


REQUIRED = object()


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
    """What a task kind accepts: whether it needs a path, and its options."""

    needs_path: bool
    options: dict[str, Option]


KINDS: dict[str, Kind] = {
    "ppl": Kind(True, {"lang": Option(_name, None)}),
    "belebele": Kind(True, {"shots": Option(_count(0), 2)}),
    "piqa": Kind(True, {"shots": Option(_count(0), 2)}),
    "flores": Kind(
        True,
        {
            "src": Option(_name, REQUIRED),
            "tgt": Option(_name, REQUIRED),
            "shots": Option(_count(0), 2),
            "split": Option(_name, "devtest"),
            "metric": Option(_choice("chrf", "chrf++"), "chrf"),
            "max_new_tokens": Option(_count(1), 256),
            "src_name": Option(str, None),
            "tgt_name": Option(str, None),
        },
    ),
    "copain": Kind(
        False,
        {
            "shots": Option(_count(0), 5),
            "n": Option(_count(1), 150),
            "max_new_tokens": Option(_count(1), 16),
        },
    ),
}


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


def load_task(spec: TaskSpec) -> Task:
    """Read a task's data files (no model needed), so bad data fails before a model loads.

    Raises:
        EvalDataError: a data file is missing or malformed.
    """
    # Imported here: these modules import torch, which `surgery --help` must not pay for.
    if spec.kind == "ppl":
        from eval.perplexity import PerplexityTask

        return PerplexityTask.from_spec(spec)
    if spec.kind in ("belebele", "piqa"):
        from eval.multiple_choice import MultipleChoiceTask

        return MultipleChoiceTask.from_spec(spec)
    if spec.kind == "flores":
        from eval.translation import TranslationTask

        return TranslationTask.from_spec(spec)
    from eval.copain import CopainTask

    return CopainTask.from_spec(spec)


def _kinds() -> str:
    return ", ".join(KINDS)


def _split_path_and_options(rest: str) -> tuple[str, str]:
    head, _, tail = rest.rpartition(":")
    pieces = tail.split(",")
    if tail and all(_OPTION_RE.match(piece.strip()) for piece in pieces):
        return head.strip(), tail
    return rest.strip(), ""


def _parse_options(text: str, kind_name: str, kind: Kind, option_text: str) -> dict[str, Any]:
    allowed = {"name": Option(_name, kind_name), **kind.options}
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
