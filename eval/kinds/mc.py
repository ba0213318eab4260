"""Multiple choice by summed log-likelihood, shared by the belebele, piqa and multiple_choice
kinds: items, prompts, scoring and metrics (each kind reads its rows into items: its `Schema`).

Prompts follow lm-evaluation-harness's task configs exactly (the item's text, then for each
choice ``target_delimiter + choice`` scored after it; k demonstrations first, each
``text + target_delimiter + correct choice + fewshot_delimiter``, by default ``" "`` and
``"\\n\\n"``).

acc picks the choice with the highest summed log-probability; acc_norm divides it by the
choice's length in characters, acc_bytes (Global-PIQA, as lm-eval reports it) by its length in
UTF-8 bytes; the delimiter is not counted. Standard errors are lm-eval's (sample standard
deviation / sqrt(n)).

The model is run by `eval.scoring`, imported only when a model is scored (it pulls in torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.data import Row, doc_id, text_sha256
from eval.errors import TaskSpecError, data_error
from eval.kinds.base import Settings, TaskSpec
from eval.kinds.shots import choose_shots
from eval.kinds.templates import FEWSHOT_DELIMITER, TARGET_DELIMITER
from eval.published import HubSource, rows_for, source_config, task_rows
from eval.tokens import TextEncoder, parse_add_bos


@dataclass(frozen=True)
class McItem:
    """One question: its text (without answer), the choices, the right one, and its row."""

    question: str
    choices: list[str]
    label: int
    doc: dict[str, Any] = field(default_factory=dict, compare=False)

    def demonstration(
        self, target_delimiter: str = TARGET_DELIMITER, fewshot_delimiter: str = FEWSHOT_DELIMITER
    ) -> str:
        """The item with its correct answer, as one k-shot block (delimiter included)."""
        return self.question + target_delimiter + self.choices[self.label] + fewshot_delimiter


@dataclass(frozen=True)
class Schema:
    """How one file format becomes items, and what lm-eval reports and samples for it.

    exclude_self: demonstrations come from the evaluated split (lm-eval's ``fewshot_split`` is
    its ``test_split``), so the sampler draws one more and drops the item.
    """

    name: str
    read: Callable[[Row], McItem]
    sampler: str
    exclude_self: bool
    metrics: tuple[str, ...]
    target_delimiter: str = TARGET_DELIMITER
    fewshot_delimiter: str = FEWSHOT_DELIMITER


SchemaFor = Callable[[TaskSpec, list[Row]], Schema]


def read_items(
    schema_for: SchemaFor, path: Path, config: str | None = None, split: str = "test"
) -> tuple[Schema, list[McItem]]:
    """Read a file of rows (JSON lines or Parquet) as `schema_for` reads them, or one config's
    split of a dataset snapshot folder in its published layout (`eval.published`).

    Raises:
        EvalDataError: bad JSON, a missing or empty field, a label out of range, no such
            config or split.
    """
    rows = task_rows(path, config, split)[0]
    schema = schema_for(TaskSpec("", path), rows)
    return schema, [schema.read(row) for row in rows]


def build_contexts(
    items: list[McItem],
    shots: list[list[int]],
    count: int,
    target_delimiter: str = TARGET_DELIMITER,
    fewshot_delimiter: str = FEWSHOT_DELIMITER,
) -> list[str]:
    """Prompts of the first `count` items, each after its demonstrations (`shots[i]`)."""
    return [
        "".join(items[j].demonstration(target_delimiter, fewshot_delimiter) for j in shots[i])
        + items[i].question
        for i in range(count)
    ]


def stderr(values: list[float]) -> float:
    """lm-eval's standard error of a mean: sample standard deviation / sqrt(n) (nan if n < 2)."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def _argmax(values: list[float]) -> int:
    return values.index(max(values))  # the first wins ties, as numpy's argmax


def predictions(scores: list[float], choices: list[str]) -> dict[str, int]:
    """The choice acc, acc_norm and acc_bytes pick from per-choice log-likelihoods."""
    return {
        "acc": _argmax(scores),
        "acc_norm": _argmax([s / len(c) for s, c in zip(scores, choices, strict=True)]),
        "acc_bytes": _argmax(
            [s / len(c.encode("utf-8")) for s, c in zip(scores, choices, strict=True)]
        ),
    }


def accuracy(
    scores: list[list[float]], items: list[McItem], metrics: tuple[str, ...] = ("acc", "acc_norm")
) -> dict[str, float]:
    """Each metric and its standard error over the items."""
    hits: dict[str, list[float]] = {m: [] for m in metrics}
    for item_scores, item in zip(scores, items, strict=True):
        picked = predictions(item_scores, item.choices)
        for metric in metrics:
            hits[metric].append(float(picked[metric] == item.label))
    result: dict[str, float] = {}
    for metric, values in hits.items():
        result[metric] = sum(values) / len(values)
        result[f"{metric}_stderr"] = stderr(values)
    return result


class MultipleChoiceTask:
    """A file of multiple-choice rows, read and checked."""

    def __init__(
        self,
        spec: TaskSpec,
        schema: Schema,
        items: list[McItem],
        files: list[Path] | None = None,
        source: HubSource | None = None,
    ) -> None:
        self.spec = spec
        self.schema = schema
        self.items = items
        self.files = files if files is not None else [spec.path]
        self.source = source

    @classmethod
    def from_spec(cls, spec: TaskSpec, schema_for: SchemaFor) -> MultipleChoiceTask:
        """Read the task's file, each row as the kind's schema (`schema_for`) reads it.

        Raises:
            EvalDataError: the file is malformed or has too few rows for the shots asked.
            TaskSpecError: the kind's options do not describe the rows.
        """
        options = spec.options
        rows, files, source, _, _ = rows_for(
            spec.dataset, spec.path, options["config"], options["split"]
        )
        schema = schema_for(spec, rows)
        items = [schema.read(row) for row in rows]
        shots = spec.options["shots"]
        if len(items) <= shots:
            raise data_error(
                spec.path or spec.dataset,  # type: ignore[arg-type]
                None,
                f"{len(items)} rows; {shots}-shot needs at least {shots + 1}",
            )
        return cls(spec, schema, items, files, source)

    @property
    def sampler(self) -> str:
        """The sampler in use: the option, or the one lm-eval's config for this schema uses."""
        return self.spec.options["sampler"] or self.schema.sampler

    def config(self) -> dict[str, Any]:
        """Kind, schema, file, shots, sampler, BOS rule and row count."""
        options = self.spec.options
        return {
            "kind": self.spec.kind,
            "schema": self.schema.name,
            "path": str(self.spec.dataset or self.spec.path),
            # A snapshot folder or a Hub dataset: which of its configs and splits was read.
            **(
                {"config": options["config"], "split": options["split"]}
                if self.files != [self.spec.path] and self.source is None
                else {}
            ),
            **(source_config(self.source) if self.source else {}),
            "shots": options["shots"],
            "sampler": self.sampler,
            "fewshot_seed": options["fewshot_seed"] if self.sampler == "default" else None,
            "add_bos": options["add_bos"],
            "rows": len(self.items),
        }

    def shots(self, count: int, seed: int) -> list[list[int]]:
        """Demonstration indices of the first `count` items."""
        return choose_shots(
            [item.doc or item for item in self.items],
            count,
            self.spec.options["shots"],
            self.sampler,
            fewshot_seed=self.spec.options["fewshot_seed"],
            exclude_self=self.schema.exclude_self,
            key=f"{self.spec.kind}/{seed}",
        )

    def contexts(self, count: int, seed: int) -> list[str]:
        """The prompts of the first `count` items."""
        schema = self.schema
        shots = self.shots(count, seed)
        return build_contexts(
            self.items, shots, count, schema.target_delimiter, schema.fewshot_delimiter
        )

    def half_items(self, limit: int | None, seed: int) -> list[int]:
        """The items (among the first `limit`) that serve as no other scored item's
        demonstration: with first_n demonstrations all but the first rows; without shots all.

        Raises:
            TaskSpecError: demonstrations drawn at random from the items scored (default or
                random sampler): nearly every item is some other's demonstration.
        """
        count = min(limit or len(self.items), len(self.items))
        if self.spec.options["shots"] and self.sampler != "first_n":
            raise TaskSpecError(
                f"task {self.spec.text!r}: its demonstrations are drawn at random from the "
                f"items it scores (sampler {self.sampler}), so it cannot be split into halves; "
                "give sampler=first_n or shots=0"
            )
        return demonstration_free(self.shots(count, seed))

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Score the first `limit` items (those of `settings.items`).

        Returns:
            `({acc, acc_norm[, acc_bytes], their _stderr, n}, {truncated})`.
        """
        count = min(settings.limit or len(self.items), len(self.items))
        kept = settings.keep(count)
        every = self.contexts(count, settings.seed)
        contexts = [every[index] for index in kept]
        evaluated = [self.items[index] for index in kept]
        encoder = TextEncoder(tokenizer, parse_add_bos(self.spec.options["add_bos"]))
        scores, truncated = score_items(
            model,
            encoder,
            contexts,
            evaluated,
            settings,
            desc=self.spec.name,
            target_delimiter=self.schema.target_delimiter,
        )
        metrics: dict[str, float | int] = dict(accuracy(scores, evaluated, self.schema.metrics))
        metrics["n"] = len(kept)
        if settings.log is not None:
            for index, context, item, item_scores in zip(
                kept, contexts, evaluated, scores, strict=True
            ):
                settings.log(self._sample(index, context, item, item_scores))
        return metrics, {"truncated": truncated, "bos": encoder.describe()}

    def _sample(self, index: int, context: str, item: McItem, scores: list[float]) -> dict:
        picked = predictions(scores, item.choices)
        return {
            "task": self.spec.name,
            "index": index,
            "doc_id": doc_id(item.doc, index),
            "prompt_sha256": text_sha256(context),
            "context": context,
            "choices": [self.schema.target_delimiter + c for c in item.choices],
            "loglikelihoods": scores,
            "lengths": [len(c) for c in item.choices],
            "byte_lengths": [len(c.encode("utf-8")) for c in item.choices],
            "gold": item.label,
            **{f"pred_{m}" if m != "acc" else "pred": picked[m] for m in self.schema.metrics},
            # 0/1 outcomes: what a paired comparison of two models resamples.
            **{m: int(picked[m] == item.label) for m in self.schema.metrics},
        }


def demonstration_free(shots: list[list[int]]) -> list[int]:
    """The largest set of items, found greedily, none of which is another's demonstration.

    `shots[i]` are item i's demonstrations. Every item used as a demonstration is set aside;
    then each of them comes back when it shows in no kept item's prompt and no kept item shows
    in its own (with first_n: the first k rows stay aside, row k comes back).
    """
    aside = {j for chosen in shots for j in chosen if j < len(shots)}
    kept = set(range(len(shots))) - aside
    for candidate in sorted(aside):
        others = kept | {candidate}
        if not any(candidate in shots[i] for i in kept) and not others & set(shots[candidate]):
            kept.add(candidate)
    return sorted(kept)


def score_items(
    model: Any,
    encoder: TextEncoder,
    contexts: list[str],
    items: list[McItem],
    settings: Settings,
    desc: str = "multiple choice",
    target_delimiter: str = TARGET_DELIMITER,
) -> tuple[list[list[float]], int]:
    """Summed log-likelihood of every choice of every item after its context (each choice after
    `target_delimiter`).

    Returns:
        `(scores per item per choice, number of contexts cut to fit settings.max_length)`.
    """
    from eval.scoring import choice_loglikelihoods, make_request  # torch, once a model scores

    made = [
        make_request(
            encoder, context, [target_delimiter + c for c in item.choices], settings.max_length
        )
        for context, item in zip(contexts, items, strict=True)
    ]
    scores = choice_loglikelihoods(
        model,
        [request for request, _ in made],
        batch_size=settings.batch_size,
        progress=settings.progress,
        desc=desc,
        prefix_cache=settings.prefix_cache,
    )
    return scores, sum(truncated for _, truncated in made)
