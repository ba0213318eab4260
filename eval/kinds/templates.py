"""lm-evaluation-harness's task template keys, with lm-eval's meaning, shared by the generic
kinds (multiple_choice and exact_match): rendering them, and the task options that give them.

A task names how a row becomes a prompt, its choices and its answer with lm-eval's keys:

- ``doc_to_text``: a column name (the row's value), else a Jinja template rendered with the
  row's columns; a rendered number is read as one when the task has choices.
- ``doc_to_choice``: a column holding a list, a template that renders a Python list literal
  (``"{{[sol1, sol2]}}"``), or a list of choices.
- ``doc_to_target``: a column, or a template; a rendered number is an index into the choices
  when there are choices, a rendered list literal a list.
- ``target_delimiter`` (default ``" "``) goes between a text and its answer,
  ``fewshot_delimiter`` (default ``"\\n\\n"``) after each demonstration.

Templates are rendered as lm-eval renders them (`jinja2` with undefined names an error, trailing
newlines kept, lm-eval's ``regex_replace`` filter). This module imports neither torch nor
transformers.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eval.errors import TaskSpecError
from eval.kinds.base import Option

TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _regex_replace(text: str, pattern: str, replacement: str, count: int = 0) -> str:
    return re.sub(pattern, replacement, text, count=count)


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.BaseLoader(), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    environment.filters["regex_replace"] = _regex_replace
    return environment


@lru_cache(maxsize=256)
def compile_template(text: str) -> Any:
    """A Jinja template, compiled once.

    Raises:
        TaskSpecError: not a valid Jinja template (the message says where).
    """
    import jinja2

    try:
        return _environment().from_string(text)
    except jinja2.TemplateSyntaxError as error:
        raise TaskSpecError(f"template {text!r}: {error.message} (line {error.lineno})") from None


def check_template(text: str) -> str:
    """A task option's converter: the text, once it compiles as a Jinja template."""
    try:
        compile_template(text)
    except TaskSpecError as error:
        raise ValueError(str(error)) from None
    return text


def render(template: str, row: dict[str, Any]) -> str:
    """A template rendered with a row's columns, as lm-eval's ``apply_template``.

    Raises:
        TaskSpecError: the template names a column the row lacks, or fails to render.
    """
    import jinja2

    try:
        return compile_template(template).render(**row)
    except jinja2.UndefinedError as error:
        columns = ", ".join(row) or "none"
        message = f"template {template!r}: {error.message} (columns: {columns})"
        raise TaskSpecError(message) from None
    except Exception as error:  # a template may raise anything (a bad index, a type error)
        raise TaskSpecError(f"template {template!r}: {type(error).__name__}: {error}") from None


@dataclass(frozen=True)
class DocTemplate:
    """lm-eval's ``doc_to_text``, ``doc_to_choice`` and ``doc_to_target``, and the delimiters.

    text, target: a column name or a template. choice: a column name, a template, a tuple of
    choices, or None (a generation task).
    """

    text: str
    target: str
    choice: str | tuple[str, ...] | None = None
    target_delimiter: str = TARGET_DELIMITER
    fewshot_delimiter: str = FEWSHOT_DELIMITER

    def doc_to_text(self, row: dict[str, Any]) -> Any:
        """The row's text (lm-eval: a number when there are choices and it renders as one)."""
        if self.text in row:
            return row[self.text]
        text = render(self.text, row)
        return ast.literal_eval(text) if text.isdigit() and self.choice is not None else text

    def doc_to_choice(self, row: dict[str, Any]) -> list[Any]:
        """The row's choices.

        Raises:
            TaskSpecError: no choices configured, or a template that renders no list.
        """
        if self.choice is None:
            raise TaskSpecError("this task has no doc_to_choice")
        if isinstance(self.choice, tuple):
            return list(self.choice)
        if self.choice in row:
            return list(row[self.choice])
        rendered = render(self.choice, row)
        try:
            choices = ast.literal_eval(rendered)
        except (SyntaxError, ValueError):
            raise TaskSpecError(
                f"doc_to_choice {self.choice!r} rendered {rendered!r}, not a list"
            ) from None
        if not isinstance(choices, list | tuple):
            raise TaskSpecError(f"doc_to_choice {self.choice!r} rendered {rendered!r}, not a list")
        return list(choices)

    def doc_to_target(self, row: dict[str, Any]) -> Any:
        """The row's target: an index, a string or a list, as lm-eval reads it."""
        if self.target in row:
            return row[self.target]
        text = render(self.target, row)
        if text.isdigit() and self.choice is not None:
            return ast.literal_eval(text)
        if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                return ast.literal_eval(text)
            except (SyntaxError, ValueError):
                return text
        return text

    def gold(self, row: dict[str, Any], choices: list[Any]) -> int | None:
        """The index of the right choice (lm-eval: an index, or a string looked up among the
        choices); None when it names none of them."""
        target = self.doc_to_target(row)
        if isinstance(target, str):
            return choices.index(target) if target in choices else None
        if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(choices):
            return target
        return None


def label_index(value: Any, count: int) -> int | None:
    """A ``label`` field's value as an index: an integer (or digit string), or a letter
    (``A`` is 0); None when it is neither or out of range."""
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            value = int(text)
        elif len(text) == 1 and text.upper() in LETTERS:
            value = LETTERS.index(text.upper())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count:
        return value
    return None


def unescape(text: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` as the characters (a task string cannot hold a newline)."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m[1]], text)


def template(value: Any) -> str:
    """A field name or a Jinja template, kept as written."""
    return check_template(str(value))


def delimiter(value: Any) -> str:
    """A delimiter as written; in a task string ``\\n`` and ``\\t`` stand for the characters."""
    return unescape(str(value))


TEMPLATE_OPTIONS = {
    "doc_to_text": Option(template, None, "lm-eval's doc_to_text: a field or a template", True),
    "doc_to_target": Option(template, None, "lm-eval's doc_to_target: a field or a template", True),
    "target_delimiter": Option(
        delimiter, TARGET_DELIMITER, "between a text and its answer (lm-eval's)", True
    ),
    "fewshot_delimiter": Option(
        delimiter, FEWSHOT_DELIMITER, "after each demonstration (lm-eval's)", True
    ),
}


def exclusive(options: dict[str, Any], field: str, key: str) -> str:
    """Which of a part's two options is given.

    Raises:
        TaskSpecError: both or neither.
    """
    given = [name for name in (field, key) if options.get(name) is not None]
    if len(given) != 1:
        which = "both" if given else "neither"
        raise TaskSpecError(f"give {field}= or {key}= (lm-eval's key), not {which}")
    return given[0]
