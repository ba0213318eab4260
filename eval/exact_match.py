"""Few-shot generation scored by exact match: the ``exact_match`` kind (`eval.kinds.exact`).

A prompt is k demonstrations, each ``text + target_delimiter + answer + fewshot_delimiter``,
then the item's text (lm-eval's few-shot context). The model continues it greedily until the
stop string; the answer before it, stripped, scores 1 when it equals the target, stripped.
exact_match is the mean over items, its stderr lm-eval's (sample standard deviation / sqrt(n)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.data import doc_id, text_sha256
from eval.errors import data_error
from eval.generation import generate_until
from eval.kinds.exact import AnswerReader
from eval.multiple_choice import stderr
from eval.published import HubSource, rows_for, source_config
from eval.shots import choose_shots
from eval.tasks import Settings, TaskSpec
from eval.tokens import parse_add_bos


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
