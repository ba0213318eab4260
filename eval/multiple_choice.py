"""Multiple choice by summed log-likelihood: Belebele (reading) and Global-PIQA (reasoning).

Prompts (k demonstrations, each the same block followed by its correct answer, then the item;
blocks separated by a blank line):

- Belebele: ``P: <passage>\\nQ: <question>\\nA: <1>\\nB: <2>\\nC: <3>\\nD: <4>\\nAnswer:``,
  choices `` A`` .. `` D``.
- Global-PIQA (cloze): ``<prompt>``, choices `` <solution0>`` and `` <solution1>``.

acc picks the choice with the highest summed log-probability; acc_norm divides it by the
choice's length in characters first (lm-evaluation-harness's definitions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.data import read_jsonl
from eval.errors import data_error
from eval.model_loading import prefix_ids
from eval.scoring import choice_loglikelihoods, make_request
from eval.shots import draw_shots
from eval.tasks import Settings, TaskSpec

LETTERS = "ABCD"


@dataclass(frozen=True)
class McItem:
    """One question: its prompt block (without answer), answer strings, index of the right one."""

    question: str
    choices: list[str]
    label: int

    def demonstration(self) -> str:
        """The block with its correct answer filled in, for k-shot prompts."""
        return self.question + self.choices[self.label]


def read_belebele(path: Path) -> list[McItem]:
    """Read Belebele rows: flores_passage, question, mc_answer1..4, correct_answer_num (1..4).

    Raises:
        EvalDataError: bad JSON, a missing or empty field, an answer number outside 1..4.
    """
    items = []
    for row in read_jsonl(path):
        answers = [row.text(f"mc_answer{n}") for n in range(1, 5)]
        options = "".join(f"{letter}: {a}\n" for letter, a in zip(LETTERS, answers, strict=True))
        question = f"P: {row.text('flores_passage')}\nQ: {row.text('question')}\n{options}Answer:"
        label = row.label("correct_answer_num", range(1, 5)) - 1
        items.append(McItem(question, [f" {letter}" for letter in LETTERS], label))
    return items


def read_piqa(path: Path) -> list[McItem]:
    """Read Global-PIQA rows: prompt, solution0, solution1, label (0 or 1).

    Raises:
        EvalDataError: bad JSON, a missing or empty field, a label other than 0 or 1.
    """
    items = []
    for row in read_jsonl(path):
        solutions = [" " + row.text(f"solution{n}").strip() for n in range(2)]
        items.append(McItem(row.text("prompt").rstrip(), solutions, row.label("label", range(2))))
    return items


READERS = {"belebele": read_belebele, "piqa": read_piqa}


def build_contexts(items: list[McItem], count: int, shots: int, key: str) -> list[str]:
    """Prompts of the first `count` items, each with `shots` demonstrations from the others.

    Args:
        items: every item of the file (demonstrations may come from all of them).
        count: how many items to evaluate (`--limit`).
        shots: demonstrations per prompt.
        key: task kind and seed, e.g. ``"belebele/0"``; the item index is appended.

    Returns:
        One prompt per evaluated item.
    """
    contexts = []
    for index in range(count):
        others = [j for j in range(len(items)) if j != index]
        chosen = draw_shots(others, shots, f"{key}/{index}")
        blocks = [items[j].demonstration() for j in chosen] + [items[index].question]
        contexts.append("\n\n".join(blocks))
    return contexts


def accuracy(scores: list[list[float]], items: list[McItem]) -> tuple[float, float]:
    """acc and acc_norm of per-choice log-likelihoods (first choice wins ties, like argmax)."""
    hits = hits_norm = 0
    for item_scores, item in zip(scores, items, strict=True):
        normed = [s / len(c) for s, c in zip(item_scores, item.choices, strict=True)]
        hits += item_scores.index(max(item_scores)) == item.label
        hits_norm += normed.index(max(normed)) == item.label
    return hits / len(items), hits_norm / len(items)


class MultipleChoiceTask:
    """A Belebele or Global-PIQA file, read and checked."""

    def __init__(self, spec: TaskSpec, items: list[McItem]) -> None:
        self.spec = spec
        self.items = items

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> MultipleChoiceTask:
        """Read the task's file.

        Raises:
            EvalDataError: the file is malformed or has too few rows for the shots asked.
        """
        assert spec.path is not None  # parse_task guarantees a path for these kinds
        items = READERS[spec.kind](spec.path)
        shots = spec.options["shots"]
        if len(items) <= shots:
            raise data_error(
                spec.path, None, f"{len(items)} rows; {shots}-shot needs at least {shots + 1}"
            )
        return cls(spec, items)

    def config(self) -> dict[str, Any]:
        """Kind, file, shots and row count."""
        return {
            "kind": self.spec.kind,
            "path": str(self.spec.path),
            "shots": self.spec.options["shots"],
            "rows": len(self.items),
        }

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Score the first `limit` items. Returns `({acc, acc_norm, n}, {truncated})`."""
        count = min(settings.limit or len(self.items), len(self.items))
        key = f"{self.spec.kind}/{settings.seed}"
        contexts = build_contexts(self.items, count, self.spec.options["shots"], key)
        evaluated = self.items[:count]
        scores, truncated = score_items(
            model, tokenizer, contexts, evaluated, settings, desc=self.spec.name
        )
        acc, acc_norm = accuracy(scores, evaluated)
        return {"acc": acc, "acc_norm": acc_norm, "n": count}, {"truncated": truncated}


def score_items(
    model: Any,
    tokenizer: Any,
    contexts: list[str],
    items: list[McItem],
    settings: Settings,
    desc: str = "multiple choice",
) -> tuple[list[list[float]], int]:
    """Summed log-likelihood of every choice of every item after its context.

    Returns:
        `(scores per item per choice, number of contexts cut to fit settings.max_length)`.
    """
    prefix = prefix_ids(tokenizer)
    made = [
        make_request(tokenizer, prefix, context, item.choices, settings.max_length)
        for context, item in zip(contexts, items, strict=True)
    ]
    scores = choice_loglikelihoods(
        model,
        [request for request, _ in made],
        batch_size=settings.batch_size,
        progress=settings.progress,
        desc=desc,
    )
    return scores, sum(truncated for _, truncated in made)
