"""``multiple_choice``: any multiple-choice benchmark, named by its fields or by
lm-evaluation-harness's template keys (`eval.templates`); scored as `eval.multiple_choice`
scores Belebele (summed log-likelihood of each choice; acc and acc_norm as lm-eval computes
them).

Each part of a row is read from a field or from lm-eval's key, never both:

- the text: ``context`` (a field) or ``doc_to_text``;
- the choices: ``choices`` (several fields, ``a|b|c`` or a YAML list, or one field holding a
  list) or ``doc_to_choice``;
- the right choice: ``label`` (a field holding an index from 0 or a letter from ``A``) or
  ``doc_to_target``.

Demonstrations are drawn from the evaluated split (lm-eval's ``fewshot_split`` equal to its
``test_split``: the item itself is never one of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eval.data import Row
from eval.errors import EvalDataError, TaskSpecError, data_error
from eval.kinds.base import MC_OPTIONS, Kind, Option, register, shots
from eval.templates import (
    FEWSHOT_DELIMITER,
    TARGET_DELIMITER,
    DocTemplate,
    check_template,
    label_index,
    unescape,
)

# (field option, lm-eval key) of each part of a row; exactly one of each pair is given.
PARTS = (("context", "doc_to_text"), ("choices", "doc_to_choice"), ("label", "doc_to_target"))


def field_names(value: Any) -> tuple[str, ...]:
    """``choices``: field names as ``a|b|c`` (a task string) or a YAML list."""
    names = value if isinstance(value, list | tuple) else str(value).split("|")
    names = tuple(str(name).strip() for name in names)
    if not all(names):
        raise ValueError("expected field names, e.g. sol1|sol2 or a YAML list")
    return names


def choice_template(value: Any) -> str | tuple[str, ...]:
    """``doc_to_choice``: a field, a template rendering a list, or a YAML list of choices."""
    if isinstance(value, list | tuple):
        return tuple(str(item) for item in value)
    return check_template(str(value))


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


@dataclass(frozen=True)
class ChoiceReader:
    """How a row becomes (text, choices, index of the right one), from the task's options."""

    context: str | None
    choices: tuple[str, ...] | None
    label: str | None
    template: DocTemplate

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ChoiceReader:
        """Check that each part is named once.

        Raises:
            TaskSpecError: a part named twice or not at all.
        """
        for field, key in PARTS:
            exclusive(options, field, key)
        return cls(
            options["context"],
            options["choices"],
            options["label"],
            DocTemplate(
                options["doc_to_text"] or "",
                options["doc_to_target"] or "",
                options["doc_to_choice"],
                options["target_delimiter"],
                options["fewshot_delimiter"],
            ),
        )

    def read(self, row: Row) -> tuple[str, list[str], int]:
        """The row's text, choices and right choice.

        Raises:
            EvalDataError: a missing field, a text or choice that is not a string, a label that
                names no choice (the message names the file and the line).
        """
        try:
            text = row.text(self.context) if self.context else self.template.doc_to_text(row.data)
            choices = self._choices(row)
            gold = self._gold(row, choices)
        except TaskSpecError as error:  # a template that does not fit this row
            raise data_error(row.path, row.line, str(error)) from None
        if not isinstance(text, str):
            raise data_error(row.path, row.line, f"the text is {text!r}, not a string")
        return text, choices, gold

    def _choices(self, row: Row) -> list[str]:
        if self.choices is None:
            values = self.template.doc_to_choice(row.data)
        elif len(self.choices) == 1 and isinstance(row.field(self.choices[0]), list):
            values = row.field(self.choices[0])
        else:
            values = [row.field(name) for name in self.choices]
        if len(values) < 2 or not all(isinstance(v, str) and v for v in values):
            raise data_error(
                row.path, row.line, f"choices {values!r}: expected two or more non-empty strings"
            )
        return list(values)

    def _gold(self, row: Row, choices: list[str]) -> int:
        if self.label is not None:
            value = row.field(self.label)
            gold = label_index(value, len(choices))
        else:
            target = self.template.doc_to_target(row.data)
            if isinstance(target, list):
                raise TaskSpecError(f"doc_to_target gave a list {target!r}: one answer per row")
            value, gold = target, self.template.gold(row.data, choices)
        if gold is None:
            raise EvalDataError(
                f"{row.path}:{row.line}: the answer {value!r} names none of the "
                f"{len(choices)} choices (an index from 0, a letter from A, or a choice's text)"
            )
        return gold


KIND = register(
    Kind(
        "multiple_choice",
        "PATH",
        "any multiple-choice rows (.jsonl[.gz] or .parquet, a snapshot folder with "
        "config=CONFIG, or hub:ID[#CONFIG][@SPLIT[@REVISION]]), named by fields (context, "
        "choices, label) or by lm-eval's template keys (doc_to_text, doc_to_choice, "
        "doc_to_target, target_delimiter, fewshot_delimiter); each choice scored by its summed "
        "log-likelihood after the text; acc, acc_norm and their stderr as lm-eval computes them",
        {
            "context": Option(str, None, "field of the text before the answer"),
            "choices": Option(
                field_names, None, "fields of the choices (a|b|c), or one field of a list", True
            ),
            "label": Option(str, None, "field of the right choice: an index from 0 or a letter"),
            **TEMPLATE_OPTIONS,
            "doc_to_choice": Option(
                choice_template, None, "lm-eval's doc_to_choice: field, template or list", True
            ),
            **MC_OPTIONS,
            "shots": shots(0),
        },
        loader="eval.multiple_choice:load_mapped",
        hub=True,
        sampler="default",
    )
)
