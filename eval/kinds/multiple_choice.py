"""``multiple_choice``: any multiple-choice benchmark, named by its fields or by
lm-evaluation-harness's template keys (`eval.kinds.templates`); scored as belebele is
(`eval.kinds.mc`: summed log-likelihood of each choice; acc and acc_norm as lm-eval computes
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
from eval.kinds.base import MC_OPTIONS, Kind, Option, TaskSpec, register, shots
from eval.kinds.mc import McItem, MultipleChoiceTask, Schema
from eval.kinds.templates import (
    TEMPLATE_OPTIONS,
    DocTemplate,
    check_template,
    exclusive,
    label_index,
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


def schema(spec: TaskSpec, rows: list[Row]) -> Schema:
    """The rows read through the task's fields or lm-eval's template keys; lm-eval's default
    sampler.

    Raises:
        TaskSpecError: a part of the row named twice or not at all.
    """
    reader = ChoiceReader.from_options(spec.options)

    def read(row: Row) -> McItem:
        text, choices, gold = reader.read(row)
        return McItem(text, choices, gold, row.data)

    template = reader.template
    return Schema(
        "mapped",
        read,
        "default",
        True,
        ("acc", "acc_norm"),
        template.target_delimiter,
        template.fewshot_delimiter,
    )


def load(spec: TaskSpec) -> MultipleChoiceTask:
    """The ``multiple_choice`` kind's loader."""
    return MultipleChoiceTask.from_spec(spec, schema)


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
        loader=load,
        hub=True,
        sampler="default",
    )
)
