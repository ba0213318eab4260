"""``exact_match``: any few-shot generation benchmark scored by exact match, named by its
fields or by lm-evaluation-harness's template keys (`eval.kinds.templates`).

The text is ``input`` (a field) or ``doc_to_text``; the answer is ``target`` (a field) or
``doc_to_target``. A prompt is k demonstrations (text, ``target_delimiter``, answer,
``fewshot_delimiter``) and the item's text. The model generates greedily until ``stop`` (by
default the few-shot delimiter, lm-eval's default ``until``) or ``max_new_tokens``; the answer is
the text before the stop, stripped of surrounding whitespace, and scores 1 when it equals the
target, also stripped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.data import Row, doc_id, text_sha256
from eval.errors import TaskSpecError, data_error
from eval.kinds.base import MC_OPTIONS, Kind, Option, Settings, TaskSpec, count, register, shots
from eval.kinds.mc import stderr
from eval.kinds.shots import choose_shots
from eval.kinds.templates import TEMPLATE_OPTIONS, DocTemplate, delimiter, exclusive
from eval.published import HubSource, rows_for, source_config
from eval.tokens import parse_add_bos

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
        for part, key in PARTS:
            exclusive(options, part, key)
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


@dataclass(frozen=True)
class Answered:
    """One row: the text the model continues, the right answer, and the row."""

    text: str
    answer: str
    doc: dict[str, Any] = field(default_factory=dict, compare=False)


def exact_match(generated: str, answer: str) -> int:
    """1 when the generated answer, stripped, equals the right one, stripped; else 0."""
    return int(generated.strip() == answer.strip())


class ExactMatchTask:
    """A generation benchmark's rows, read through the task's fields or templates."""

    def __init__(
        self,
        spec: TaskSpec,
        reader: AnswerReader,
        items: list[Answered],
        files: list[Path],
        source: HubSource | None,
        where: tuple[str | None, str],
    ) -> None:
        self.spec = spec
        self.reader = reader
        self.items = items
        self.files = files
        self.source = source
        self.where = where  # (config, split) read

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> ExactMatchTask:
        """Read the rows.

        Raises:
            TaskSpecError: the text or the answer named twice or not at all.
            EvalDataError: the rows are malformed or too few for the shots asked.
        """
        reader = AnswerReader.from_options(spec.options)
        options = spec.options
        rows, files, source, config, split = rows_for(
            spec.dataset, spec.path, options["config"], options["split"]
        )
        items = [Answered(*reader.read(row), row.data) for row in rows]
        if len(items) <= options["shots"]:
            raise data_error(
                spec.path or spec.dataset,  # type: ignore[arg-type]
                None,
                f"{len(items)} rows; {options['shots']}-shot needs at least {options['shots'] + 1}",
            )
        return cls(spec, reader, items, files, source, (config, split))

    @property
    def sampler(self) -> str:
        """The sampler in use: the option, else lm-eval's default."""
        return self.spec.options["sampler"] or "default"

    def config(self) -> dict[str, Any]:
        """Kind, data, shots, sampler, stop string, generation limit and row count."""
        options = self.spec.options
        config, split = self.where
        return {
            "kind": self.spec.kind,
            "path": str(self.spec.dataset or self.spec.path),
            # A snapshot folder or a Hub dataset: which of its configs and splits was read.
            **({"config": config, "split": split} if self.files != [self.spec.path] else {}),
            **(source_config(self.source) if self.source else {}),
            "shots": options["shots"],
            "sampler": self.sampler,
            "fewshot_seed": options["fewshot_seed"] if self.sampler == "default" else None,
            "stop": self.reader.stop,
            "max_new_tokens": options["max_new_tokens"],
            "add_bos": options["add_bos"],
            "rows": len(self.items),
        }

    def prompts(self, count: int, seed: int) -> list[str]:
        """The few-shot prompts of the first `count` items."""
        chosen = choose_shots(
            [item.doc or item for item in self.items],
            count,
            self.spec.options["shots"],
            self.sampler,
            fewshot_seed=self.spec.options["fewshot_seed"],
            key=f"{self.spec.kind}/{seed}",
        )
        demonstration = self.reader.demonstration
        return [
            "".join(demonstration(self.items[j].text, self.items[j].answer) for j in chosen[i])
            + self.items[i].text
            for i in range(count)
        ]

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Generate an answer for each of the first `limit` items and score it.

        Returns:
            `({exact_match, exact_match_stderr, n}, {})`.
        """
        from eval.generation import generate_until  # torch, once a model scores

        count = min(settings.limit or len(self.items), len(self.items))
        prompts = self.prompts(count, settings.seed)
        generated = generate_until(
            model,
            tokenizer,
            prompts,
            stop=self.reader.stop,
            max_new_tokens=self.spec.options["max_new_tokens"],
            max_length=settings.max_length,
            batch_size=settings.batch_size,
            progress=settings.progress,
            desc=self.spec.name,
            add_bos=parse_add_bos(self.spec.options["add_bos"]),
        )
        hits = [
            exact_match(text, item.answer)
            for text, item in zip(generated, self.items, strict=False)
        ]
        if settings.log is not None:
            for index, (prompt, text) in enumerate(zip(prompts, generated, strict=True)):
                item = self.items[index]
                record = {"task": self.spec.name, "index": index, "doc_id": doc_id(item.doc, index)}
                record.update(prompt_sha256=text_sha256(prompt), prompt=prompt)
                record.update(generation=text, target=item.answer, exact_match=hits[index])
                settings.log(record)
        scores = [float(hit) for hit in hits]
        metrics = {"exact_match": sum(scores) / count, "exact_match_stderr": stderr(scores)}
        return {**metrics, "n": count}, {}


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
        loader=ExactMatchTask.from_spec,
        hub=True,
        sampler="default",
    )
)
