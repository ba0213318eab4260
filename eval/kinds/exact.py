"""``exact_match``: any few-shot generation benchmark scored by exact match, named by its
fields or by lm-evaluation-harness's template keys (`eval.templates`); scored by
`eval.exact_match`.

The text is ``input`` (a field) or ``doc_to_text``; the answer is ``target`` (a field) or
``doc_to_target``. A prompt is k demonstrations (text, ``target_delimiter``, answer,
``fewshot_delimiter``) and the item's text. The model generates greedily until ``stop`` (by
default the few-shot delimiter, lm-eval's default ``until``) or ``max_new_tokens``; the answer is
the text before the stop, stripped of surrounding whitespace, and scores 1 when it equals the
target, also stripped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eval.data import Row
from eval.errors import TaskSpecError, data_error
from eval.kinds.base import MC_OPTIONS, Kind, Option, count, register, shots
from eval.kinds.choice import TEMPLATE_OPTIONS, delimiter, exclusive
from eval.templates import DocTemplate

PARTS = (("input", "doc_to_text"), ("target", "doc_to_target"))


@dataclass(frozen=True)
class AnswerReader:
    """How a row becomes (text, answer), from the task's options."""

    input: str | None
    target: str | None
    template: DocTemplate
    stop: str

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> AnswerReader:
        """Check that the text and the answer are each named once.

        Raises:
            TaskSpecError: a part named twice or not at all.
        """
        for field, key in PARTS:
            exclusive(options, field, key)
        template = DocTemplate(
            options["doc_to_text"] or "",
            options["doc_to_target"] or "",
            None,
            options["target_delimiter"],
            options["fewshot_delimiter"],
        )
        stop = options["stop"] if options["stop"] is not None else template.fewshot_delimiter
        if not stop:
            raise TaskSpecError("stop= must not be empty")
        return cls(options["input"], options["target"], template, stop)

    def read(self, row: Row) -> tuple[str, str]:
        """The row's text and answer.

        Raises:
            EvalDataError: a missing field, or a text or answer that is not a string.
        """
        try:
            text = row.text(self.input) if self.input else self.template.doc_to_text(row.data)
            answer = (
                row.field(self.target) if self.target else self.template.doc_to_target(row.data)
            )
        except TaskSpecError as error:  # a template that does not fit this row
            raise data_error(row.path, row.line, str(error)) from None
        if isinstance(answer, int | float) and not isinstance(answer, bool):
            answer = str(answer)
        for what, value in (("text", text), ("answer", answer)):
            if not isinstance(value, str):
                raise data_error(row.path, row.line, f"the {what} is {value!r}, not a string")
        return text, answer

    def demonstration(self, text: str, answer: str) -> str:
        """One solved example, its few-shot delimiter included (lm-eval: an empty answer adds
        neither delimiter)."""
        template = self.template
        if not answer:
            return text
        return text + template.target_delimiter + answer + template.fewshot_delimiter


KIND = register(
    Kind(
        "exact_match",
        "PATH",
        "any few-shot generation rows (.jsonl[.gz] or .parquet, a snapshot folder with "
        "config=CONFIG, or hub:ID[#CONFIG][@SPLIT[@REVISION]]), named by fields (input, target) "
        "or by lm-eval's template keys (doc_to_text, doc_to_target, target_delimiter, "
        "fewshot_delimiter); greedy generation until the stop string, exact match of the "
        "stripped answer; exact_match and its stderr",
        {
            "input": Option(str, None, "field of the text the model continues"),
            "target": Option(str, None, "field of the right answer"),
            **TEMPLATE_OPTIONS,
            "stop": Option(delimiter, None, "end of an answer (none: fewshot_delimiter)", True),
            "max_new_tokens": Option(count(1), 32, "longest answer generated"),
            **MC_OPTIONS,
            "shots": shots(0),
        },
        loader="eval.exact_match:ExactMatchTask.from_spec",
        hub=True,
        sampler="default",
    )
)
